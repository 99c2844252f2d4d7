"""A live relay's rows are never "stuck", and an operator's short --threshold cannot take them.

An on-call engineer ran ``requeue-stuck --threshold 1s`` beside a relay still delivering a slow batch: every row
was taken from it and delivered twice. Now the relay renews its rows at a third of the shorter of its lease and
its stuck threshold, and a ``--threshold`` under twice that renewal is refused unless ``--force``.
"""

import threading
import time

from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.operations.maintenance import requeue_stuck
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, enqueue_n, statuses
from outbox_pipelines_tests.processes import wait_until

EVENTS = "outbox_events"


def test_a_relay_s_slow_batch_is_not_stuck_for_its_table_s_short_threshold(db_url, conn):
    """Lease 60 s, stuck threshold 1.5 s: a batch in dispatch for 2.5 s is renewed, and requeue leaves it."""
    enqueue_n(conn, EVENTS, 4)
    released = threading.Event()

    def slow(message):  # the delivery the batch waits on, until the test lets it answer
        released.wait(30)
        return Outcome.sent()

    settings = table_settings(EVENTS, claim="lease", lease_s=60.0, stuck_threshold_s=1.5, batch_size=4)
    relay = Relay(db_url, settings, ScriptedDestination(slow))
    thread = threading.Thread(target=relay.run, kwargs={"once": True})
    thread.start()
    try:
        wait_until(lambda: statuses(conn, EVENTS) == {"sending": 4}, 10, "the batch claimed")
        time.sleep(2.5)  # past the threshold, on the wall clock the relay's lease keeper runs on
        assert requeue_stuck(db_url, settings).requeued == 0
    finally:
        released.set()
        thread.join(30)
    assert statuses(conn, EVENTS) == {"sent": 4}
    assert "outbox_flush_conflict" not in audit_codes(conn, EVENTS)


def test_requeue_stuck_refuses_a_threshold_a_live_relay_would_lose_its_rows_to(db_url, conn, cli_env):
    enqueue_n(conn, EVENTS, 3)
    conn.execute(
        f"UPDATE {EVENTS} SET status = 'sending', locked_by = 'w', attempts = 1, "
        "locked_at = now(), updated_at = now() - interval '5 seconds', "
        "lease_expires_at = now() + interval '55 seconds'"
    )
    refused = run_cli(cli_env, "requeue-stuck", "--table", EVENTS, "--threshold", "1s")
    assert refused.returncode == 2, refused
    assert "would take rows from a relay that is alive" in refused.stderr and "--force" in refused.stderr
    assert "nothing was requeued" in refused.stderr
    assert statuses(conn, EVENTS) == {"sending": 3}

    forced = run_cli(cli_env, "requeue-stuck", "--table", EVENTS, "--threshold", "1s", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"{EVENTS}: requeued 3" in forced.stdout
    assert statuses(conn, EVENTS) == {"pending": 3}
