"""claim = "auto", the default: a batch delivered within `hold` is held in the relay's transaction and
written once; one still in dispatch at `hold` is leased and committed; a message that kills its relay
still has that attempt counted (its relay noted the batch it held) and reaches dead."""

import time
from datetime import timedelta

import psycopg
import pytest

from outbox_pipelines import Outcome
from outbox_pipelines.core.relay import Relay, liveness
from outbox_pipelines.core.relay.lease_keeper import runs_of
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.processes import handlers_project_env, start_relay

POISON_HANDLERS = """
import os
from outbox_pipelines.core.destinations.handlers import HandlerRegistry

registry = HandlerRegistry()


def _deliver(message):
    with open(os.environ["POISON_LOG"], "a", encoding="utf-8") as log:
        log.write(message.event_id + "\\n")
    if message.payload.get("poison"):
        os._exit(3)  # the handler takes its process down (a segfault, an OOM kill)


registry.register("t", _deliver)
"""


def test_a_slow_batch_is_leased_at_hold_and_its_transaction_ends_while_it_is_in_flight(db_url, conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    seen: dict[str, object] = {}

    def slow(msg):
        time.sleep(0.6)  # past the 0.2 s hold
        with psycopg.connect(db_url, autocommit=True) as probe:
            seen["row"] = probe.execute(
                f"SELECT status, attempts, locked_by FROM {EVENTS} WHERE id = %s", (row_id,)
            ).fetchone()
            seen["idle_in_transaction"] = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction'"
            ).fetchone()[0]
        return Outcome.sent()

    report = Relay(db_url, events_settings(hold_s=0.2), ScriptedDestination(slow), worker_id="w-slow").run(once=True)
    # While the destination still worked on it, the lease was committed: visible to anyone, no transaction held.
    assert seen["row"] == ("sending", 1, "w-slow")
    assert seen["idle_in_transaction"] == 0
    assert (report.sent, report.leased_after_hold, report.conflicts) == (1, 1, 0)
    assert (rows(conn, EVENTS)[0]["status"], rows(conn, EVENTS)[0]["attempts"]) == ("sent", 1)
    assert audit_codes(conn, EVENTS, row_id) == ["outbox_claim", "outbox_flush_success"]


def test_a_quick_batch_stays_held_and_nobody_sees_it_in_flight(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 3)
    seen = []

    def quick(msg):
        with psycopg.connect(db_url, autocommit=True) as probe:
            seen.append(probe.execute(f"SELECT status, attempts FROM {EVENTS} WHERE id = %s", (msg.id,)).fetchone())
        return Outcome.sent()

    report = Relay(db_url, events_settings(), ScriptedDestination(quick)).run(once=True)
    assert seen == [("pending", 0)] * 3  # held, not written: the row is written once, at the settle
    assert (report.sent, report.leased_after_hold) == (3, 0)
    assert [audit_codes(conn, EVENTS, i) for i in ids] == [["outbox_flush_success"]] * 3


@pytest.mark.slow
def test_a_message_that_kills_its_relay_reaches_dead_under_the_default_claim(cli_env, conn, tmp_path):
    handled = tmp_path / "handled.log"
    env = handlers_project_env(
        cli_env,
        tmp_path,
        "poison_handlers",
        POISON_HANDLERS,
        "max_attempts = 3\nparallelism = 1\n",
        POISON_LOG=str(handled),
    )
    conn.execute(
        "INSERT INTO outbox_events (event_id, topic, payload, payload_sha) "
        "VALUES ('poison-1', 't', '{\"poison\": true}', 'sha256:poison')"
    )
    for attempt in range(1, 4):
        proc = start_relay(env, EVENTS, "--once")
        assert proc.wait(timeout=60) == 3  # the handler took the relay down
        [row] = rows(conn, EVENTS)
        assert (row["status"], row["attempts"]) == ("pending", attempt - 1)  # its transaction died with it
        # The liveness sweep finds the relay dead (its process is gone) and counts the attempt it held.
        [dead] = liveness.find_dead(conn, now=db_now(conn) + timedelta(seconds=30))
        buried = liveness.bury(conn, dead, max_attempts=3)
        assert buried is not None and buried.held == 1
    [row] = rows(conn, EVENTS)
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("dead", 3, "LEASE_EXPIRED")
    assert "died while delivering it" in row["last_error"]
    assert handled.read_text().split() == ["poison-1"] * 3
    assert audit_codes(conn, EVENTS, row["id"]) == ["outbox_requeue", "outbox_requeue", "outbox_flush_dead"]
    # Dead: the next relay leaves it alone.
    proc = start_relay(env, EVENTS, "--once")
    assert proc.wait(timeout=60) == 0
    assert statuses(conn, EVENTS) == {"dead": 1}


def test_a_held_batch_is_noted_as_runs_of_consecutive_ids_at_one_attempt_count():
    held = [(10, 0), (11, 0), (12, 0), (15, 0), (16, 2), (17, 2), (30, 0)]
    assert runs_of(held) == ([10, 15, 16, 30], [12, 15, 17, 30], [0, 0, 2, 0])
    assert runs_of([]) == ([], [], [])


def test_a_dead_relays_noted_runs_count_only_its_rows_still_pending_at_that_attempt(conn):
    from outbox_pipelines.core.storage.table import OutboxTable

    ids = enqueue_n(conn, EVENTS, 6)
    # Rows 3 and 4 (between the runs) are another relay's; row 5 moved on since (sent).
    conn.execute(f"UPDATE {EVENTS} SET status = 'sent', attempts = 1 WHERE id = %s", (ids[4],))
    starts, ends, attempts = runs_of([(ids[0], 0), (ids[1], 0), (ids[4], 0), (ids[5], 0)])
    counted = OutboxTable(conn, EVENTS).count_died_holding("liveness", "ghost", starts, ends, attempts, max_attempts=5)
    assert sorted(r["id"] for r in counted) == [ids[0], ids[1], ids[5]]
    by_id = {r["id"]: (r["status"], r["attempts"]) for r in rows(conn, EVENTS)}
    assert [by_id[i] for i in ids] == [
        ("pending", 1),
        ("pending", 1),
        ("pending", 0),
        ("pending", 0),
        ("sent", 1),
        ("pending", 1),
    ]
