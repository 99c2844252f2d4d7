"""The outbox_pipelines benchmark: scenarios, ceilings and reporting (run it with bench/run.py)."""
