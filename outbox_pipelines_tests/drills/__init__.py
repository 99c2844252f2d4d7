"""On-call drills: the real `outbox-pipelines dev` and broker simulator, faults injected, alerts timed.

Run them with ``pytest -m drill outbox_pipelines_tests/drills`` (about 15 minutes);
``python bench/drills.py`` runs them several times and tabulates the alert times.
"""
