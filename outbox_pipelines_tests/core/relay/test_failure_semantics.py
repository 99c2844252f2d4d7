"""Faults of an ordinary week: throttling, outages, lost leases. Good messages never die of them."""

import threading
import time
from datetime import timedelta

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.errors import DatabaseUnavailable
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.relay import LeaseKeeper, Relay, liveness
from outbox_pipelines.core.relay import session as relay_session
from outbox_pipelines.core.storage.table import OutboxTable, Settlement
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, enqueue_n, rows, statuses

EVENTS = "outbox_events"


def settings(**overrides):
    return table_settings(EVENTS, **{"mode": "competing", "idle_sleep_s": 0.01, **overrides})


def health(conn) -> dict:
    return conn.execute("SELECT * FROM outbox_destination_health WHERE table_name = %s", (EVENTS,)).fetchone() or {}


def test_an_outage_opens_the_circuit_and_spends_no_attempts(db_url, conn):
    enqueue_n(conn, EVENTS, 12)
    down = ScriptedDestination(lambda msg: Outcome.retry(m.NETWORK_TIMEOUT, "connection refused"))
    report = Relay(db_url, settings(batch_size=5, circuit_threshold=3, probe_interval_s=0.3), down).run(max_seconds=1.5)
    assert report.circuit == "open" and report.outcome == "destination_failing"
    assert health(conn)["circuit_opened_at"] is not None
    # the batch that opened it and every probe since gave their attempt back: nobody died of the outage
    assert {(r["status"], r["attempts"]) for r in rows(conn, EVENTS)} == {("pending", 0)}
    # one probe at a time while open (about one per probe interval), not a batch per claim
    assert 2 <= report.probes <= 7 and report.claimed <= 5 + report.probes


def test_the_first_success_closes_the_circuit_and_waiting_retries_are_due_at_once(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 6)
    down = ScriptedDestination(lambda msg: Outcome.retry(m.BROKER_5XX, "HTTP 503"))
    # threshold above the first batch: those messages retry with backoff, as the policy says
    Relay(db_url, settings(batch_size=2, circuit_threshold=4, probe_interval_s=0.2), down).run(max_entries=6)
    backed_off = rows(conn, EVENTS, "attempts = 1")
    assert backed_off and all(r["available_at"] > r["updated_at"] for r in backed_off)
    assert health(conn)["circuit_opened_at"] is not None
    up = ScriptedDestination(lambda msg: Outcome.sent(ref=f"ok-{msg.id}"))
    conn.execute("UPDATE outbox_destination_health SET next_probe_at = now()")  # the next probe is due
    started = time.monotonic()
    # one drain: the probe succeeds, the circuit closes, the backed-off messages are due at once
    report = Relay(db_url, settings(batch_size=10, circuit_threshold=4, probe_interval_s=0.2), up).run(once=True)
    assert statuses(conn, EVENTS) == {"sent": 6}, statuses(conn, EVENTS)
    assert health(conn)["circuit_opened_at"] is None and health(conn)["failing_since"] is None
    assert report.sent == 6 and time.monotonic() - started < 2
    assert sorted(r["id"] for r in rows(conn, EVENTS)) == ids


def test_a_pipelined_relay_goes_on_at_once_when_its_probe_succeeds(db_url, conn):
    """While the probe is on the wire the relay claims ahead, finds the circuit open and waits for the next
    probe; the probe's success ends that wait, so the rest drains now, not a probe interval later."""
    enqueue_n(conn, EVENTS, 9)
    conn.execute(
        "INSERT INTO outbox_destination_health (table_name, destination, circuit_opened_at, failing_since, "
        "next_probe_at) VALUES (%s, 'd', now(), now(), now())",
        (EVENTS,),
    )

    class Slow(BatchSizes):
        pipelined = True

        def deliver(self, messages):
            self.calls.append(len(messages))
            time.sleep(0.05)  # on the wire long enough for the relay to claim ahead meanwhile
            return [Outcome.sent() for _ in messages]

    destination = Slow()
    started = time.monotonic()
    report = Relay(db_url, settings(batch_size=4, probe_interval_s=30), destination).run(once=True)
    assert statuses(conn, EVENTS) == {"sent": 9}
    assert destination.calls[0] == 1 and report.probes == 1  # one probe, then full batches
    assert time.monotonic() - started < 5, "waited for the next probe after the circuit had closed"


def test_per_message_failures_still_follow_the_retry_policy(db_url, conn):
    """A 400 dies at once and a handler error retries with backoff; neither opens the circuit."""
    enqueue_n(conn, EVENTS, 4)
    outcomes = iter([Outcome.dead(m.BAD_REQUEST, "HTTP 400"), Outcome.retry(m.HANDLER_ERROR, "boom")] * 2)
    Relay(db_url, settings(batch_size=4, circuit_threshold=1), ScriptedDestination(lambda msg: next(outcomes))).run(
        max_entries=4
    )
    assert sorted((r["status"], r["attempts"]) for r in rows(conn, EVENTS)) == [
        ("dead", 1),
        ("dead", 1),
        ("pending", 1),
        ("pending", 1),
    ]
    assert health(conn).get("circuit_opened_at") is None


def test_a_429_storm_dead_letters_nothing(db_url, conn):
    enqueue_n(conn, EVENTS, 3)
    throttled = ScriptedDestination(lambda msg: Outcome.retry(m.RATE_LIMITED, "HTTP 429", delay_s=0.05))
    tight = settings(batch_size=3, retry=table_settings(EVENTS).retry.with_overrides(max_attempts=2))
    report = Relay(db_url, tight, throttled).run(max_seconds=1.0)
    assert report.rate_limited >= 6  # each message throttled again and again, far past max_attempts = 2
    assert {(r["status"], r["attempts"]) for r in rows(conn, EVENTS)} == {("pending", 0)}


def test_the_claim_re_takes_an_expired_lease_and_fences_its_old_holder(conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    outbox_table = OutboxTable(conn, EVENTS)
    [first] = outbox_table.claim("gone", 1, 0.01)
    time.sleep(0.05)  # the lease (10 ms) is server time; let it pass
    [again] = outbox_table.claim("alive", 1, 60)
    assert (again.id, again.attempts) == (row_id, 2)
    assert outbox_table.settle("gone", [Settlement(first.id, first.attempts, "sent", m.AUDIT_SUCCESS)]) == set()
    assert outbox_table.settle("alive", [Settlement(again.id, again.attempts, "sent", m.AUDIT_SUCCESS)]) == {row_id}
    detail = conn.execute(
        "SELECT detail FROM outbox_audit WHERE message_id = %s AND code = 'outbox_claim' ORDER BY id DESC LIMIT 1",
        (row_id,),
    ).fetchone()["detail"]
    assert detail == "re-taken: the lease of gone expired"


def test_the_claim_leaves_an_expired_lease_on_its_last_attempt_to_requeue_stuck(conn):
    enqueue_n(conn, EVENTS, 1)
    outbox_table = OutboxTable(conn, EVENTS)
    outbox_table.claim("gone", 1, 0.01, max_attempts=1)
    time.sleep(0.05)
    assert outbox_table.claim("alive", 1, 60, max_attempts=1) == []
    [moved] = outbox_table.requeue_stuck("sweep", stuck_after_s=600, max_attempts=1)
    assert moved["status"] == "dead"


def test_the_lease_keeper_survives_an_unreachable_database(db_url, conn, monkeypatch):
    """connect() raising DatabaseUnavailable (not a psycopg error) must not kill the keeper thread."""
    real_connect, failures = relay_session.connect, [0]

    def flaky(url, **kwargs):
        if failures[0] < 2:
            failures[0] += 1
            raise DatabaseUnavailable("cannot connect to PostgreSQL: test")
        return real_connect(url, **kwargs)

    monkeypatch.setattr(relay_session, "connect", flaky)
    with real_connect(db_url) as own:
        liveness.register(own, "keeper-test", EVENTS, None)
        own.execute(
            "UPDATE outbox_relay_workers SET heartbeat_at = now() - interval '1 hour' WHERE worker = 'keeper-test'"
        )
    keeper = LeaseKeeper(db_url, EVENTS, "keeper-test", lease_s=0.3, renew_every_s=0.1, heartbeat_s=0.05)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            beat = conn.execute(
                "SELECT now() - heartbeat_at AS ago FROM outbox_relay_workers WHERE worker = 'keeper-test'"
            ).fetchone()["ago"]
            if beat < timedelta(seconds=5):
                break
            time.sleep(0.05)
        assert failures[0] == 2 and beat < timedelta(seconds=5)
    finally:
        keeper.close()


def test_a_batch_that_could_not_be_settled_is_given_back_not_stranded(db_url, conn):
    """The session dies while a batch is on the wire: no lease is renewed for it, and the rows are back
    in pending as soon as the relay reconnects (not after their lease); SIGTERM-style stop leaves none held."""
    enqueue_n(conn, EVENTS, 4)
    killed = threading.Event()

    def kill_then_answer(msg):
        if not killed.is_set():
            killed.set()
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        return Outcome.sent()

    relay = Relay(db_url, settings(batch_size=4, lease_s=600), ScriptedDestination(kill_then_answer))
    report = relay.run(max_seconds=3)
    assert report.db_errors >= 1
    assert conn.execute("SELECT count(*) AS n FROM outbox_events WHERE status = 'sending'").fetchone()["n"] == 0
    assert statuses(conn, EVENTS).get("sent", 0) == 4  # given back, re-claimed, delivered again (same keys)


class BatchSizes(Destination):
    """A destination that accepts everything and remembers how many messages each call carried."""

    name = "batch sizes"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def deliver(self, messages):
        self.calls.append(len(messages))
        return [Outcome.sent(ref=f"r{m.id}") for m in messages]

    def close(self) -> None:
        pass


def test_after_a_throttle_one_message_goes_first_then_full_batches(db_url, conn):
    """A pause that ran out is probed with one message (every relay of the table would otherwise send a
    full batch into a destination that may still be throttling); the first success lifts it for all."""
    enqueue_n(conn, EVENTS, 5)
    conn.execute(
        "INSERT INTO outbox_destination_health (table_name, paused_until, pause_reason) "
        "VALUES (%s, now() - interval '1 second', '429 Retry-After')",
        (EVENTS,),
    )
    destination = BatchSizes()
    Relay(db_url, settings(batch_size=5), destination).run(once=True)
    assert destination.calls == [1, 4]
    assert health(conn)["pause_reason"] is None and health(conn)["paused_until"] is None


def test_a_pipelined_relay_sends_no_batch_while_the_circuit_is_open(db_url, conn):
    """The batch claimed ahead goes back unsent, attempt given back, when the one on the wire opens the circuit."""
    enqueue_n(conn, EVENTS, 6)

    class Down(BatchSizes):
        pipelined = True

        def deliver(self, messages):
            self.calls.append(len(messages))
            return [Outcome.retry(m.NETWORK_TIMEOUT, "refused") for _ in messages]

    destination = Down()
    Relay(db_url, settings(batch_size=3, circuit_threshold=3, probe_interval_s=60), destination).run(once=True)
    assert destination.calls == [3]  # the second batch was claimed ahead, then given back unsent
    assert {(r["status"], r["attempts"]) for r in rows(conn, EVENTS)} == {("pending", 0)}
