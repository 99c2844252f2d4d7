"""Issue 25, "alerts that do not clear": the lag check grades what waits now, not what happened before.

Lag is the age of the messages waiting now (pending and due, or in flight), each counted from when it
became due: a replay makes a message due now, a retry when its backoff ends. Nothing waiting: lag passes
with 0, whatever the last hour's deliveries took. A table whose messages wait with no relay still fails,
with its advice. Against real PostgreSQL, through oncall.table_verdicts: the verdicts the Dagster asset
check and the on-call sweep both use.
"""

from datetime import timedelta

import pytest

from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message, Outcome
from outbox_pipelines.core.oncall.health import CheckVerdict, TableStatus, evaluate_checks, read_status
from outbox_pipelines.core.oncall.sweep import sweep, table_verdicts
from outbox_pipelines.core.operations.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, db_now, enqueue_n, rows, statuses

EVENTS = "outbox_events"
SETTINGS = load_settings(env={}, path=None)  # the shipped thresholds: lag p95 60 s / 5 min, oldest 5 / 30 min
ADVICE = "Check that a relay run is active for the table"


def lag(conn, *, later_s: float = 0.0) -> CheckVerdict:
    """The table's lag verdict, ``later_s`` seconds from now by the database clock."""
    now = db_now(conn) + timedelta(seconds=later_s) if later_s else None
    return {v.name: v for v in table_verdicts(conn, SETTINGS, EVENTS, now=now)}["lag"]


def relay_once(db_url, destination=None) -> None:
    settings = table_settings(EVENTS, mode="competing", idle_sleep_s=0.01)
    Relay(db_url, settings, destination or ScriptedDestination()).run(once=True)


def make_dead(conn, row_id: int) -> None:
    """Created three days ago, dead for two, after its retries."""
    conn.execute(
        "UPDATE outbox_events SET status = 'dead', attempts = 6, last_error_code = 'BROKER_5XX', "
        "last_error = 'HTTP 503', created_at = now() - interval '3 days', "
        "available_at = now() - interval '2 days 1 hour', updated_at = now() - interval '2 days' "
        "WHERE id = %s",
        (row_id,),
    )


def lag_alerts(db_url) -> list[str]:
    """One on-call sweep (no webhook): the statuses it told for the table's lag check."""
    return [
        a["status"] for a in sweep(db_url, SETTINGS, webhook_url="").alerts if a["alert_key"] == f"check:{EVENTS}:lag"
    ]


def shift(conn, ids, seconds: float, *columns: str) -> None:
    """Move the given timestamp columns of rows ``seconds`` into the past."""
    assignments = ", ".join(f"{c} = {c} - make_interval(secs => %(s)s)" for c in columns)
    conn.execute(f"UPDATE outbox_events SET {assignments} WHERE id = ANY(%(ids)s)", {"s": seconds, "ids": ids})


def test_after_a_70_s_outage_a_table_with_nothing_waiting_passes_lag(db_url, conn):
    # A low-volume table: five messages delivered at once...
    enqueue_n(conn, EVENTS, 5, prefix="before-")
    relay_once(db_url)
    # ...then the receiver is down for 70 s: three messages wait (created and due 75 s ago).
    during = enqueue_n(conn, EVENTS, 3, prefix="during-")
    shift(conn, during, 75, "created_at", "available_at")
    waiting = lag(conn)
    assert waiting.severity == "warn", waiting.description  # the outage shows while it lasts
    assert ADVICE in waiting.description and "3 waiting" in waiting.description
    assert waiting.metadata["waiting_now"] == 3 and waiting.metadata["lag_now_s"] == pytest.approx(75, abs=5)

    relay_once(db_url)  # the receiver is back: the queue drains
    assert statuses(conn, EVENTS) == {"sent": 8}
    # The last hour's deliveries still say 75 s (3 of 8): the figure the check used to grade.
    status = read_status(OutboxTable(conn, EVENTS))
    assert status.lag_p95_s is not None and status.lag_p95_s >= 60
    for later_s in (0, 20 * 60):  # at once, and 20 minutes on with nothing sent since
        verdict = lag(conn, later_s=later_s)
        assert verdict.severity == "ok", (later_s, verdict.description)
        assert verdict.metadata["waiting_now"] == 0 and verdict.metadata["lag_now_s"] == 0
        assert verdict.metadata["lag_now_p95_s"] == 0
        assert ADVICE not in verdict.description and "nothing waiting" in verdict.description


def test_replaying_an_old_dead_message_raises_no_lag_before_or_after_it_is_delivered(db_url, conn):
    enqueue_n(conn, EVENTS, 3, prefix="fresh-")
    relay_once(db_url)
    # A message created three days ago that died two days ago, after its retries.
    [old] = enqueue_n(conn, EVENTS, 1, prefix="old-")
    make_dead(conn, old)
    assert lag(conn).severity == "ok"

    report = replay_dead(db_url, EVENTS, ReplayFilter(ids=(old,)))
    assert report.replayed == 1
    replayed = lag(conn)  # due now: it waits 0 s, not 3 days
    assert replayed.severity == "ok", replayed.description
    assert replayed.metadata["waiting_now"] == 1 and replayed.metadata["lag_now_s"] < 5
    assert lag(conn, later_s=30).severity == "ok"

    relay_once(db_url)
    assert rows(conn, EVENTS, f"id = {old}")[0]["status"] == "sent"
    status = read_status(OutboxTable(conn, EVENTS))
    assert status.lag_p95_s is not None and status.lag_p95_s > 86400  # created → delivered: 3 days
    for later_s in (0, 10 * 60):
        delivered = lag(conn, later_s=later_s)
        assert delivered.severity == "ok", (later_s, delivered.description)
        assert delivered.metadata["waiting_now"] == 0


def test_a_replayed_message_no_relay_takes_ages_from_its_replay(db_url, conn):
    """The replay resets the clock; a relay that never comes still shows, timed from the replay."""
    [old] = enqueue_n(conn, EVENTS, 1, prefix="old-")
    make_dead(conn, old)
    replay_dead(db_url, EVENTS, ReplayFilter(ids=(old,)))
    assert lag(conn, later_s=30).severity == "ok"
    two_min = lag(conn, later_s=120)
    assert two_min.severity == "warn" and ADVICE in two_min.description
    assert two_min.metadata["lag_now_s"] == pytest.approx(120, abs=5)
    assert lag(conn, later_s=600).severity == "error"


def test_messages_waiting_with_no_relay_still_fail_lag_with_its_advice(conn):
    enqueue_n(conn, EVENTS, 4)
    assert lag(conn, later_s=30).severity == "ok"
    warn = lag(conn, later_s=120)
    assert warn.severity == "warn"
    assert warn.description.startswith(f"{EVENTS}: messages wait too long: ")
    assert ADVICE in warn.description and "4 waiting" in warn.description
    assert (warn.metadata["waiting_now"], warn.metadata["lag_now_s"]) == (4, pytest.approx(120, abs=5))
    assert lag(conn, later_s=600).severity == "error"  # p95 past 5 min
    assert lag(conn, later_s=35 * 60).severity == "error"


def test_an_old_message_in_flight_counts_from_when_it_became_due(conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    OutboxTable(conn, EVENTS).claim("w", 1, 3600)
    shift(conn, [row_id], 400, "available_at")
    shift(conn, [row_id], 3 * 86400, "created_at")
    verdict = lag(conn)
    assert verdict.severity == "error" and verdict.metadata["waiting_now"] == 1  # due 400 s ago, still not sent
    assert verdict.metadata["lag_now_s"] == pytest.approx(400, abs=5)


def test_a_retry_in_backoff_is_not_late_until_its_backoff_ends(conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    conn.execute(
        "UPDATE outbox_events SET attempts = 3, created_at = now() - interval '10 minutes', "
        "available_at = now() + interval '5 minutes', last_error_code = 'BROKER_5XX' WHERE id = %s",
        (row_id,),
    )
    backing_off = lag(conn)
    assert backing_off.severity == "ok" and backing_off.metadata["waiting_now"] == 0
    assert "1 more not due yet" in backing_off.description
    # Due for two minutes with nobody to take it: 2 min late (not the 17 min since it was created).
    due = lag(conn, later_s=7 * 60)
    assert due.severity == "warn" and due.metadata["lag_now_s"] == pytest.approx(120, abs=5)


def test_a_message_scheduled_for_later_is_not_late(conn):
    Outbox(EVENTS).enqueue(
        conn,
        Message(topic="t", payload={"n": 1}, event_id="later", available_at=db_now(conn) + timedelta(hours=1)),
        outside_transaction=True,
    )
    assert lag(conn, later_s=30 * 60).severity == "ok"
    assert lag(conn, later_s=63 * 60).severity == "warn"


def test_messages_held_behind_a_parked_key_are_told_by_blocked_keys_not_lag(db_url, conn):
    outbox = Outbox(EVENTS)
    for name in ("a1", "a2", "a3"):
        outbox.enqueue(
            conn, Message(topic="t", payload={"name": name}, event_id=name, ordering_key="a"), outside_transaction=True
        )
    reject = ScriptedDestination(lambda msg: Outcome.dead(m.BAD_REQUEST, "HTTP 400"))
    Relay(db_url, table_settings(EVENTS, mode="competing", idle_sleep_s=0.01), reject).run(max_seconds=5, max_entries=2)
    assert statuses(conn, EVENTS) == {"dead": 1, "pending": 2}
    verdicts = {v.name: v for v in table_verdicts(conn, SETTINGS, EVENTS, now=db_now(conn) + timedelta(hours=1))}
    assert verdicts["blocked_keys"].severity == "warn"
    assert verdicts["lag"].severity == "ok" and verdicts["lag"].metadata["waiting_now"] == 0


def test_the_on_call_lag_alert_fires_in_an_outage_and_resolves_once_the_queue_drains(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 3)
    shift(conn, ids, 75, "created_at", "available_at")  # due 75 s ago, the receiver down
    assert lag_alerts(db_url) == ["firing"]
    relay_once(db_url)
    assert lag_alerts(db_url) == ["resolved"]
    assert lag_alerts(db_url) == []


def test_the_replay_of_an_old_dead_message_tells_on_call_nothing_about_lag(db_url, conn):
    [old] = enqueue_n(conn, EVENTS, 1, prefix="old-")
    make_dead(conn, old)
    assert lag_alerts(db_url) == []
    replay_dead(db_url, EVENTS, ReplayFilter(ids=(old,)))
    assert lag_alerts(db_url) == []  # waiting, due since the replay
    relay_once(db_url)
    assert lag_alerts(db_url) == []  # delivered, three days after it was created


# -- the verdict on its own: a TableStatus as the snapshot would read it --------------------------------------


def verdict(**fields) -> CheckVerdict:
    counts = {"pending": 0, "retrying": 0, "sending": 0, "sent": 0, "dead": 0, **fields.pop("counts", {})}
    status = TableStatus(EVENTS, counts=counts, **fields)
    return {v.name: v for v in evaluate_checks(status, SETTINGS.tables[EVENTS].checks)}["lag"]


def test_nothing_waiting_passes_whatever_the_last_hour_took():
    quiet = verdict(lag_p95_s=5000.0, lag_p99_s=86400.0 * 3, lag_sample=9)
    assert quiet.severity == "ok"
    assert quiet.description == "outbox_events: nothing waiting, lag 0s."
    assert quiet.metadata["lag_p95_s"] == 5000.0  # shown, not graded


@pytest.mark.parametrize(("p95_s", "severity"), [(59.9, "ok"), (60.0, "warn"), (299.0, "warn"), (300.0, "error")])
def test_the_p95_of_what_waits_now_is_graded_against_lag_p95(p95_s, severity):
    assert verdict(counts={"pending": 20}, waiting_now=20, lag_now_p95_s=p95_s, lag_now_s=p95_s).severity == severity


@pytest.mark.parametrize(("oldest_s", "severity"), [(299.0, "ok"), (300.0, "warn"), (1800.0, "error")])
def test_the_oldest_waiting_now_is_graded_against_oldest_pending(oldest_s, severity):
    status = verdict(counts={"pending": 500}, waiting_now=500, lag_now_p95_s=1.0, lag_now_s=oldest_s)
    assert status.severity == severity


def test_what_fails_says_how_late_what_waits_now_is_and_what_to_check():
    late = verdict(
        counts={"pending": 4, "retrying": 2, "sending": 1},
        waiting_now=5,
        lag_now_p95_s=400.0,
        lag_now_s=410.0,
        oldest_waiting_age_s=3 * 86400.0,
    )
    assert late.severity == "error"
    assert late.description == (
        "outbox_events: messages wait too long: lag p95 6.7 min (warn at 60 s), oldest waiting message due "
        "6.8 min ago (warn at 5 min), 5 waiting (2 more not due yet: retrying after a backoff, scheduled, or "
        "behind an earlier message of their key). Check that a relay run is active for the table and what the "
        "destination check says."
    )
    assert (late.metadata["waiting_now"], late.metadata["lag_now_s"], late.metadata["lag_now_p95_s"]) == (
        5,
        410.0,
        400.0,
    )
