"""Seed 003 end to end: a memory store over HTTP, dedup by (target, payload_sha), leases held by their holder."""

import json
import time
from datetime import timedelta

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.operations.maintenance import requeue_stuck
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.relay.lease import (
    ack_sent,
    check_dedup,
    claim_outbox,
    fail_retry,
    mark_dead_by_worker,
    renew_lease,
)
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import audit_codes, db_now, rows

TABLE = "outbox_memory"


def remember(conn, event_id: str, text: str, space: str = "team:alpha") -> int:
    return (
        Outbox(TABLE)
        .enqueue(conn, Message(topic=space, payload={"md": text}, event_id=event_id), outside_transaction=True)
        .id
    )


def memory_store(key, attempt, body):
    return 200, {"Content-Type": "application/json"}, json.dumps({"memory_id": f"mem-{key}"}).encode()


def relay_to(db_url, sink, **overrides):
    settings = table_settings(TABLE, destination="http", url=sink.url, **overrides)
    destination = HttpDestination(sink.url, timeout_s=5)
    try:
        return Relay(db_url, settings, destination).run(once=True)
    finally:
        destination.close()


def test_memory_writes_are_deduplicated_by_target_and_payload(db_url, conn, http_sink):
    http_sink.script = memory_store
    first = remember(conn, "m-1", "the deploy key rotates monthly")
    relay_to(db_url, http_sink)
    twin = remember(conn, "m-2", "the deploy key rotates monthly")  # same space, same payload
    elsewhere = remember(conn, "m-3", "the deploy key rotates monthly", "team:beta")  # another target
    report = relay_to(db_url, http_sink)
    assert (report.sent, report.dedup_hits) == (2, 1)
    assert http_sink.keys() == ["m-1", "m-3"]  # the twin never reached the store
    by_id = {r["id"]: r for r in rows(conn, TABLE)}
    assert by_id[first]["result_ref"] == "mem-m-1"
    assert (by_id[twin]["result_ref"], by_id[twin]["last_error_code"]) == ("mem-m-1", "DEDUP_HIT")
    assert audit_codes(conn, TABLE, twin) == ["outbox_claim", "outbox_flush_dedup_hit"]
    assert by_id[elsewhere]["result_ref"] == "mem-m-3"


def test_the_lease_is_renewed_around_a_slow_store_call(db_url, conn, http_sink):
    """While the store call runs past the lease, a stuck sweep must find nothing to take back."""
    remember(conn, "slow-1", "a long write")
    swept = []

    def slow_store(key, attempt, body):
        time.sleep(1.2)  # the relay's 0.6 s lease would have expired twice without renewal
        settings = table_settings(TABLE)
        swept.append(requeue_stuck(db_url, settings).requeued)
        return memory_store(key, attempt, body)

    http_sink.script = slow_store
    report = relay_to(db_url, http_sink, lease_s=0.6)
    assert swept == [0]
    assert (report.sent, report.conflicts) == (1, 0)
    assert rows(conn, TABLE)[0]["status"] == "sent"


def test_the_lease_protocol_functions_answer_false_to_a_non_holder(db_url, conn):
    for n in range(4):
        remember(conn, f"p-{n}", f"fact {n}")
    a, b, c, d = claim_outbox(conn, TABLE, "worker-a", limit=4, lease_seconds=30)
    assert renew_lease(conn, TABLE, a, "worker-a") is True
    assert renew_lease(conn, TABLE, a, "worker-b") is False
    assert ack_sent(conn, TABLE, a, "worker-b", memory_id="mem-x") is False
    assert ack_sent(conn, TABLE, a, "worker-a", memory_id="mem-a") is True
    assert ack_sent(conn, TABLE, a, "worker-a", memory_id="mem-a") is False  # already settled
    retry_at = db_now(conn) + timedelta(seconds=120)
    assert fail_retry(conn, TABLE, b, "worker-a", "store timeout", retry_at, error_code="NETWORK_TIMEOUT") is True
    assert mark_dead_by_worker(conn, TABLE, c, "worker-z", "nope") is False
    assert mark_dead_by_worker(conn, TABLE, c, "worker-a", "target space invalid", error_code="BAD_REQUEST") is True
    by_id = {r["id"]: r for r in rows(conn, TABLE)}
    assert by_id[a.id]["result_ref"] == "mem-a"
    assert abs((by_id[b.id]["available_at"] - retry_at).total_seconds()) < 1
    assert (by_id[c.id]["status"], by_id[d.id]["status"]) == ("dead", "sending")
    conflicts = conn.execute(
        "SELECT worker, detail FROM outbox_audit WHERE code = 'outbox_flush_conflict' ORDER BY id"
    ).fetchall()
    assert [c_["worker"] for c_ in conflicts] == ["worker-b", "worker-b", "worker-a", "worker-z"]
    assert check_dedup(conn, TABLE, "team:alpha", a.payload_sha)["result_ref"] == "mem-a"
    assert check_dedup(conn, TABLE, "team:alpha", "sha256:none") is None


def test_an_expired_lease_can_be_reclaimed_and_the_old_holder_is_refused(db_url, conn):
    remember(conn, "x-1", "contended")
    [held] = claim_outbox(conn, TABLE, "worker-a", limit=1, lease_seconds=5)
    later = db_now(conn) + timedelta(seconds=6)
    OutboxTable(conn, TABLE).requeue_stuck("sweeper", stuck_after_s=600, max_attempts=10, now=later)
    [taken] = OutboxTable(conn, TABLE).claim("worker-b", 1, 60, now=later)
    assert taken.id == held.id and taken.attempts == 2
    assert ack_sent(conn, TABLE, held, "worker-a") is False
    assert ack_sent(conn, TABLE, taken, "worker-b") is True
    detail = conn.execute("SELECT detail FROM outbox_audit WHERE code = 'outbox_flush_conflict'").fetchone()["detail"]
    assert detail == "lease lost: row is sending, held by worker-b at attempt 2"
