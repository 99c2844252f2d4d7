"""The relay loop on one process: delivery outcomes, modes, budgets, wake-ups, throttling, recovery."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from outbox_pipelines import (
    DatabaseUnavailable,
    HandlerRegistry,
    Message,
    Outbox,
    Outcome,
    RetryPolicy,
)
from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations import HandlerDestination
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.rows import make_due


@contextmanager
def relay_running(db_url: str, destination: Destination, **settings: Any) -> Iterator[Relay]:
    """A relay running on a thread of the test (20 s at most), stopped and joined on the way out."""
    relay = Relay(db_url, events_settings(**settings), destination)
    worker = threading.Thread(target=relay.run, kwargs={"max_seconds": 20})
    worker.start()
    try:
        yield relay
    finally:
        relay.request_stop()
        worker.join(10)


def test_retryable_failures_end_dead_after_max_attempts(db_url, conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    settings = events_settings(retry=RetryPolicy(base_s=60, max_s=60, max_attempts=3, jitter=0))
    destination = ScriptedDestination(lambda msg: Outcome.retry(m.BROKER_5XX, "HTTP 503"))
    for expected_attempts in (1, 2, 3):
        make_due(conn, EVENTS)
        report = Relay(db_url, settings, destination).run(once=True)
        assert report.claimed == 1
        assert rows(conn, EVENTS)[0]["attempts"] == expected_attempts
    row = rows(conn, EVENTS)[0]
    assert (row["status"], row["last_error_code"]) == ("dead", m.BROKER_5XX)
    assert "gave up after 3 of 3 attempts" in row["last_error"]
    assert audit_codes(conn, EVENTS, row_id)[-1] == "outbox_flush_dead"
    assert Relay(db_url, settings, destination).run(once=True).claimed == 0


def test_permanent_failure_is_dead_at_once_and_does_not_block_others(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 5)
    poison = ids[2]
    destination = ScriptedDestination(
        lambda msg: Outcome.dead(m.BAD_REQUEST, "HTTP 400") if msg.id == poison else Outcome.sent()
    )
    report = Relay(db_url, events_settings(), destination).run(once=True)
    assert (report.sent, report.dead, report.dead_by_code) == (4, 1, {m.BAD_REQUEST: 1})
    dead = rows(conn, EVENTS, "status = 'dead'")
    assert [(r["id"], r["attempts"], r["last_error_code"]) for r in dead] == [(poison, 1, m.BAD_REQUEST)]


def test_success_policy_delete_removes_the_row_and_audits_it(db_url, conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    Relay(db_url, events_settings(on_success="delete"), ScriptedDestination()).run(once=True)
    assert rows(conn, EVENTS) == []
    assert audit_codes(conn, EVENTS, row_id) == ["outbox_flush_success"]  # one row per attempt (claim = "auto")


def test_sent_rows_record_reference_and_publish_time(db_url, conn):
    enqueue_n(conn, EVENTS, 2)
    Relay(db_url, events_settings(), ScriptedDestination()).run(once=True)
    for row in rows(conn, EVENTS):
        assert row["status"] == "sent"
        assert row["result_ref"] == f"ref-{row['id']}"
        assert row["published_at"] is not None
        assert row["locked_by"] is None and row["lease_expires_at"] is None


def test_single_active_relay_waits_while_another_holds_the_lock(db_url, conn):
    enqueue_n(conn, EVENTS, 3)
    settings = events_settings(mode="single-active", poll_interval_s=0.05)
    conn.execute("SELECT pg_advisory_lock(hashtext('outbox:' || 'outbox_events'))")
    report = Relay(db_url, settings, ScriptedDestination()).run(max_seconds=0.3)
    assert (report.lock_held, report.claimed) == (False, 0)
    assert "another relay holds" in report.stopped_because
    assert statuses(conn, EVENTS) == {"pending": 3}
    conn.execute("SELECT pg_advisory_unlock(hashtext('outbox:' || 'outbox_events'))")
    report = Relay(db_url, settings, ScriptedDestination()).run(once=True)
    assert (report.lock_held, report.sent) == (True, 3)


def test_single_active_standby_takes_over_when_the_holder_stops(db_url, conn):
    enqueue_n(conn, EVENTS, 2)
    settings = events_settings(mode="single-active", poll_interval_s=0.05)
    conn.execute("SELECT pg_advisory_lock(hashtext('outbox:' || 'outbox_events'))")
    unlock = "SELECT pg_advisory_unlock(hashtext('outbox:' || 'outbox_events'))"
    threading.Timer(0.3, lambda: conn.execute(unlock)).start()
    report = Relay(db_url, settings, ScriptedDestination()).run(max_seconds=5, max_entries=2)
    assert (report.lock_held, report.sent) == (True, 2)


def test_entry_budget_stops_claiming(db_url, conn):
    enqueue_n(conn, EVENTS, 20)
    report = Relay(db_url, events_settings(batch_size=3), ScriptedDestination()).run(max_entries=7)
    assert (report.claimed, report.sent, report.stopped_because) == (7, 7, "entry budget used")
    assert statuses(conn, EVENTS) == {"sent": 7, "pending": 13}


def test_a_claim_cut_short_by_the_entry_budget_ends_the_run_without_an_idle_wait(db_url, conn):
    enqueue_n(conn, EVENTS, 7)
    later = db_now(conn) + timedelta(hours=1)
    Outbox(EVENTS).enqueue_many(
        conn, [Message(topic="t", payload={}, available_at=later) for _ in range(5)], outside_transaction=True
    )
    started = time.monotonic()
    report = Relay(db_url, events_settings(batch_size=3, idle_sleep_s=30.0), ScriptedDestination()).run(max_entries=7)
    assert (report.sent, report.stopped_because) == (7, "entry budget used")
    # The last claim took the 1 entry left, fewer than the batch size: not an emptied queue to wait on
    # (the next row is due in an hour, the idle sleep is 30 s).
    assert time.monotonic() - started < 10


def test_time_budget_returns_when_idle(db_url):
    started = time.monotonic()
    report = Relay(db_url, events_settings(), ScriptedDestination()).run(max_seconds=0.4)
    assert report.stopped_because == "time budget used"
    assert 0.35 <= time.monotonic() - started < 3


def test_notify_wakes_an_idle_relay_quickly(db_url, conn):
    delivered = threading.Event()
    destination = ScriptedDestination(lambda msg: (delivered.set(), Outcome.sent())[1])
    with relay_running(db_url, destination, idle_sleep_s=30.0):
        time.sleep(0.3)  # let the relay go idle on its 30 s sleep
        started = time.monotonic()
        Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={}), outside_transaction=True)
        assert delivered.wait(5)
        assert time.monotonic() - started < 1.0  # far less than the 30 s idle sleep


def counting_claims(monkeypatch, reads: list[str] | None = None) -> list[int]:
    """The number of rows each claim of the relays in this test returned, in order (and in ``reads``,
    each claim and next-due read as it happened)."""
    from outbox_pipelines.core.storage.table import OutboxTable

    claims: list[int] = []
    reads = [] if reads is None else reads
    claim, claim_held, next_due = OutboxTable.claim, OutboxTable.claim_held, OutboxTable.next_due_in_s

    def noting(rows):
        claims.append(len(rows))
        reads.append(f"claim {len(rows)}")
        return rows

    def counted(self, *args, **kwargs):
        return noting(claim(self, *args, **kwargs))

    def counted_held(self, *args, **kwargs):  # claim = "auto" (the default) claims held batches
        return noting(claim_held(self, *args, **kwargs))

    def noted(self, *args, **kwargs):
        reads.append("next due")
        return next_due(self, *args, **kwargs)

    monkeypatch.setattr(OutboxTable, "claim", counted)
    monkeypatch.setattr(OutboxTable, "claim_held", counted_held)
    monkeypatch.setattr(OutboxTable, "next_due_in_s", noted)
    return claims


def test_a_batch_that_empties_the_queue_is_followed_by_a_wait_not_by_an_empty_claim(db_url, conn, monkeypatch):
    claims = counting_claims(monkeypatch)
    enqueue_n(conn, EVENTS, 2)
    report = Relay(db_url, events_settings(idle_sleep_s=30.0), ScriptedDestination(lambda msg: Outcome.sent())).run(
        max_seconds=0.5
    )
    assert (report.sent, report.stopped_because) == (2, "time budget used")
    assert claims == [2], "2 of 100 asked for: the queue was empty, nothing woke the relay, nothing to claim"


def test_a_message_committed_while_a_batch_runs_is_delivered_at_once(db_url, conn, monkeypatch):
    reads: list[str] = []
    counting_claims(monkeypatch, reads)
    second_sent = threading.Event()

    def deliver(msg):
        if msg.event_id == "first":  # committed while the relay handles the first batch: only its NOTIFY tells
            with psycopg.connect(db_url) as producer:
                Outbox(EVENTS).enqueue(
                    producer, Message(topic="t", payload={}, event_id="second"), outside_transaction=True
                )
        else:
            second_sent.set()
        return Outcome.sent()

    with relay_running(db_url, ScriptedDestination(deliver), idle_sleep_s=30.0):
        Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={}, event_id="first"), outside_transaction=True)
        started = time.monotonic()
        assert second_sent.wait(5)
        assert time.monotonic() - started < 1.0  # far less than the 30 s idle sleep
    assert statuses(conn, EVENTS) == {"sent": 2}
    # Its NOTIFY was waiting when the first batch was settled: the relay claimed at once, without
    # asking when the next row is due.
    assert reads[reads.index("claim 1") :][:2] == ["claim 1", "claim 1"], reads


def test_a_burst_of_wake_ups_announced_by_one_claim_costs_one_empty_claim(db_url, conn, monkeypatch):
    claims = counting_claims(monkeypatch)
    burst_committed, handled = threading.Event(), []

    def deliver(msg):
        if msg.event_id == "first":
            # 20 commits, 20 NOTIFYs, while the relay is busy: one claim takes the 20 rows.
            with psycopg.connect(db_url, autocommit=True) as producer:
                for n in range(20):
                    Outbox(EVENTS).enqueue(
                        producer, Message(topic="t", payload={}, event_id=f"burst-{n}"), outside_transaction=True
                    )
            burst_committed.set()
        handled.append(msg.event_id)
        return Outcome.sent()

    with relay_running(db_url, ScriptedDestination(deliver), idle_sleep_s=30.0):
        Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={}, event_id="first"), outside_transaction=True)
        assert burst_committed.wait(5)
        deadline = time.monotonic() + 5
        while len(handled) < 21 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # room for the empty claims the stale wake-ups would cost
    assert statuses(conn, EVENTS) == {"sent": 21}
    # The first message, the burst in one claim, then at most one claim to find the queue empty
    # (the other 19 NOTIFYs announced rows that claim already took).
    assert claims[:2] == [1, 20] and claims[2:] in ([], [0]), claims


def test_rate_limit_slows_the_whole_table(db_url, conn):
    enqueue_n(conn, EVENTS, 5)
    destination = ScriptedDestination(lambda msg: Outcome.retry(m.RATE_LIMITED, "HTTP 429", delay_s=30))
    report = Relay(db_url, events_settings(batch_size=1), destination).run(max_seconds=0.5)
    assert (report.claimed, report.rate_limited) == (1, 1)
    # the throttled row waits out Retry-After with its attempt given back; the others were never claimed
    waiting = rows(conn, EVENTS, "last_error_code = 'RATE_LIMITED'")
    assert [(r["status"], r["attempts"]) for r in waiting] == [("pending", 0)]
    delay = conn.execute(
        "SELECT available_at - now() AS d FROM outbox_events WHERE last_error_code = 'RATE_LIMITED'"
    ).fetchone()["d"]
    assert timedelta(seconds=28) < delay <= timedelta(seconds=30)
    # the pause is the table's, in the database, for every relay of it
    paused = conn.execute(
        "SELECT paused_until - now() AS d FROM outbox_destination_health WHERE table_name = %s", (EVENTS,)
    ).fetchone()["d"]
    assert timedelta(seconds=28) < paused <= timedelta(seconds=30)
    other = Relay(db_url, events_settings(batch_size=1), ScriptedDestination(lambda msg: Outcome.sent())).run(once=True)
    assert other.claimed == 0 and "paused" in other.stopped_because


def test_lease_is_renewed_during_a_long_dispatch(db_url, conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    observed = {}

    def slow(msg):
        # Hold the message well past its 0.6 s lease; the keeper must renew it.
        deadline = time.monotonic() + 1.5
        first = None
        while time.monotonic() < deadline:
            time.sleep(0.1)
            with psycopg.connect(db_url) as probe:
                expiry = probe.execute(
                    "SELECT lease_expires_at FROM outbox_events WHERE id = %s", (row_id,)
                ).fetchone()[0]
                first = first or expiry
                observed["last"] = expiry
                observed["first"] = first
        return Outcome.sent()

    report = Relay(db_url, events_settings(lease_s=0.6), ScriptedDestination(slow)).run(once=True)
    assert (report.sent, report.conflicts) == (1, 0)
    assert observed["last"] > observed["first"]
    assert rows(conn, EVENTS)[0]["status"] == "sent"


def test_a_plainly_delivered_batch_with_leases_taken_over_settles_the_rest_and_counts_conflicts(db_url, conn):
    """A batch delivered whole settles without a plan per message; rows another worker took meanwhile are
    conflicts (audited, left to their new holder), the rest sent."""
    ids = enqueue_n(conn, EVENTS, 6)
    taken = ids[::2]

    def take_over_then_deliver(msg):
        if msg.id == ids[0]:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute(
                    "UPDATE outbox_events SET locked_by = 'other', attempts = attempts + 1 WHERE id = ANY(%s)", (taken,)
                )
        return Outcome.sent()  # no reference, no code: the plain batch

    report = Relay(db_url, events_settings(batch_size=6), ScriptedDestination(take_over_then_deliver)).run(once=True)
    assert (report.sent, report.conflicts) == (3, 3)
    by_id = {r["id"]: r for r in rows(conn, EVENTS)}
    assert [by_id[i]["status"] for i in ids] == ["sending", "sent"] * 3
    assert all(by_id[i]["locked_by"] == "other" for i in taken)
    for row_id in taken:
        assert audit_codes(conn, EVENTS, row_id)[-1] == "outbox_flush_conflict"
    assert audit_codes(conn, EVENTS, ids[1])[-1] == "outbox_flush_success"


def test_a_destination_that_raises_loses_nothing(db_url, conn):
    class Exploding(Destination):
        name = "exploding"

        def deliver(self, messages):
            raise RuntimeError("bug in destination")

        def close(self):
            pass

    enqueue_n(conn, EVENTS, 3)
    report = Relay(db_url, events_settings(), Exploding()).run(once=True)
    assert report.retried == 3
    assert {r["last_error_code"] for r in rows(conn, EVENTS)} == {m.UNKNOWN}
    assert statuses(conn, EVENTS) == {"pending": 3}


def test_unreachable_database_is_a_clear_error():
    relay = Relay("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", events_settings(), ScriptedDestination())
    with pytest.raises(DatabaseUnavailable, match="cannot connect to PostgreSQL at .*127.0.0.1.*OUTBOX_DATABASE_URL"):
        relay.run(once=True)


def test_relay_survives_a_dropped_database_connection(db_url, conn):
    """The relay's session is killed mid-run; it reconnects, audits the error and goes on."""
    enqueue_n(conn, EVENTS, 3)
    killed = threading.Event()

    def kill_relay_session_once(msg):
        if not killed.is_set():
            killed.set()
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        return Outcome.sent()

    relay = Relay(db_url, events_settings(batch_size=1), ScriptedDestination(kill_relay_session_once))
    report = relay.run(max_seconds=5, max_entries=3)
    assert report.db_errors >= 1
    # The first row's settle was lost with the connection: given back as soon as the relay reconnected,
    # not left leased (it may be delivered again: the idempotency key makes that once).
    found = statuses(conn, EVENTS)
    assert found.get("sent", 0) >= 2 and found.get("sending", 0) == 0
    assert found.get("sent", 0) + found.get("pending", 0) == 3
    db_errors = conn.execute("SELECT count(*) AS n FROM outbox_audit WHERE code = 'outbox_flush_db_error'")
    assert db_errors.fetchone()["n"] >= 1


def test_an_outcome_the_database_cannot_store_still_ends_visible(db_url, conn):
    enqueue_n(conn, EVENTS, 1)
    destination = ScriptedDestination(lambda msg: Outcome.sent(ref="\x00bad"))
    report = Relay(db_url, events_settings(), destination).run(once=True)
    assert report.sent == 1
    assert rows(conn, EVENTS)[0]["result_ref"] == "\\u0000bad"


def test_a_one_shot_run_does_not_wait_out_a_rate_limit(db_url, conn):
    enqueue_n(conn, EVENTS, 3)
    destination = ScriptedDestination(lambda msg: Outcome.retry(m.RATE_LIMITED, "HTTP 429", delay_s=600))
    started = time.monotonic()
    report = Relay(db_url, events_settings(batch_size=1), destination).run(once=True)
    assert time.monotonic() - started < 5
    assert (report.claimed, report.rate_limited) == (1, 1)
    assert "429" in report.stopped_because


def test_switching_a_topic_off_takes_effect_on_a_running_relay(db_url, conn):
    registry = HandlerRegistry()
    handled = []
    registry.register("a", lambda msg: handled.append(msg.topic))
    registry.register("b", lambda msg: handled.append(msg.topic))
    relay = Relay(db_url, events_settings(idle_sleep_s=0.05), HandlerDestination(registry))
    worker = threading.Thread(target=relay.run, kwargs={"max_seconds": 10})
    worker.start()
    try:
        registry.set_enabled("a", False)
        time.sleep(0.2)  # the relay is between claims now
        Outbox(EVENTS).enqueue(conn, Message(topic="a", payload={}), outside_transaction=True)
        Outbox(EVENTS).enqueue(conn, Message(topic="b", payload={}), outside_transaction=True)
        deadline = time.monotonic() + 5
        while "b" not in handled and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay.request_stop()
        worker.join(10)
    assert handled == ["b"]
    assert rows(conn, EVENTS, "topic = 'a'")[0]["status"] == "pending"


def test_a_switched_off_topic_waiting_as_pending_leaves_the_relay_idle(db_url, conn, monkeypatch):
    from outbox_pipelines.core.storage.table import OutboxTable

    claims = []
    claim = OutboxTable.claim
    monkeypatch.setattr(OutboxTable, "claim", lambda self, *a, **k: claims.append(1) or claim(self, *a, **k))
    registry = HandlerRegistry()
    registry.register("a", lambda msg: None)
    registry.set_enabled("a", False)
    enqueue_n(conn, EVENTS, 3, topic="a")
    report = Relay(db_url, events_settings(idle_sleep_s=0.2), HandlerDestination(registry)).run(max_seconds=1.0)
    assert report.stopped_because == "time budget used" and report.claimed == 0
    # About one claim per idle sleep: the switched-off rows, due but not the relay's to take, do not
    # wake it (they made it claim nonstop, hundreds of times a second).
    assert len(claims) <= 10, f"{len(claims)} claims in 1 s with idle_sleep 0.2 s"
    assert statuses(conn, EVENTS) == {"pending": 3}


def test_a_destination_that_is_not_a_destination_subclass_is_refused_with_what_to_do():
    class DuckTyped:
        name = "duck"

        def deliver(self, messages):
            return []

    with pytest.raises(TypeError, match="subclass outbox_pipelines.Destination"):
        Relay("postgresql://unused", events_settings(), DuckTyped())
