"""The relay's SQL: claim order, lease holder and attempt as fencing tokens, backoff in database time."""

from datetime import timedelta

from outbox_pipelines import Message, Outbox, Outcome, RetryPolicy
from outbox_pipelines.core import models as m
from outbox_pipelines.core.relay import plan_settlement
from outbox_pipelines.core.storage.table import OutboxTable, Settlement
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import audit_codes, db_now, enqueue_n, rows


def test_claim_takes_ready_rows_in_id_order_and_counts_the_attempt(conn):
    ids = enqueue_n(conn, EVENTS, 5)
    outbox_table = OutboxTable(conn, EVENTS)
    claimed = outbox_table.claim("w1", 3, 60)
    assert [c.id for c in claimed] == ids[:3]
    assert all(c.attempts == 1 for c in claimed)
    held = rows(conn, EVENTS, "status = 'sending'")
    assert [r["locked_by"] for r in held] == ["w1"] * 3
    lease = conn.execute(
        "SELECT min(lease_expires_at - locked_at) AS lease FROM outbox_events WHERE status = 'sending'"
    ).fetchone()["lease"]
    assert lease == timedelta(seconds=60)
    assert [c.id for c in outbox_table.claim("w2", 10, 60)] == ids[3:]
    assert outbox_table.claim("w3", 10, 60) == []
    assert audit_codes(conn, EVENTS, ids[0]) == ["outbox_claim"]


def test_settle_by_a_non_holder_is_refused_and_audited(conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    outbox_table = OutboxTable(conn, EVENTS)
    [msg] = outbox_table.claim("holder", 1, 60)
    thief = Settlement(msg.id, msg.attempts, "sent", m.AUDIT_SUCCESS)
    assert outbox_table.settle("thief", [thief]) == set()
    assert rows(conn, EVENTS)[0]["status"] == "sending"
    conflict = conn.execute(
        "SELECT worker, detail FROM outbox_audit WHERE code = 'outbox_flush_conflict' AND message_id = %s", (row_id,)
    ).fetchone()
    assert conflict["worker"] == "thief"
    assert "held by holder at attempt 1" in conflict["detail"]
    assert outbox_table.settle("holder", [thief]) == {row_id}
    assert rows(conn, EVENTS)[0]["status"] == "sent"


def test_a_stale_attempt_cannot_settle_after_the_row_was_reclaimed(conn):
    """The attempt number is a fencing token, even for the same worker name."""
    enqueue_n(conn, EVENTS, 1)
    outbox_table = OutboxTable(conn, EVENTS)
    [first] = outbox_table.claim("w", 1, 5)
    later = db_now(conn) + timedelta(seconds=6)
    assert len(outbox_table.requeue_stuck("maintenance", stuck_after_s=600, max_attempts=5, now=later)) == 1
    [second] = outbox_table.claim("w", 1, 5, now=later)
    assert second.attempts == 2
    stale = Settlement(first.id, first.attempts, "dead", m.AUDIT_DEAD, error_code="X")
    assert outbox_table.settle("w", [stale]) == set()
    assert outbox_table.settle("w", [Settlement(second.id, 2, "sent", m.AUDIT_SUCCESS)]) == {second.id}
    assert audit_codes(conn, EVENTS) == [
        "outbox_claim",
        "outbox_requeue",
        "outbox_claim",
        "outbox_flush_conflict",
        "outbox_flush_success",
    ]


def test_retry_backoff_boundary_in_database_time(conn):
    enqueue_n(conn, EVENTS, 1)
    outbox_table = OutboxTable(conn, EVENTS)
    t0 = db_now(conn)
    [msg] = outbox_table.claim("w", 1, 60, now=t0)
    policy = RetryPolicy(base_s=10, max_s=100, max_attempts=5, jitter=0)
    plan = plan_settlement(msg, Outcome.retry(m.BROKER_5XX, "HTTP 503"), events_settings(retry=policy))
    assert (plan.status, plan.delay_s, plan.error_code) == ("pending", 10.0, m.BROKER_5XX)
    outbox_table.settle("w", [plan], now=t0)
    assert rows(conn, EVENTS)[0]["available_at"] == t0 + timedelta(seconds=10)
    assert outbox_table.claim("w", 1, 60, now=t0 + timedelta(seconds=9)) == []
    [again] = outbox_table.claim("w", 1, 60, now=t0 + timedelta(seconds=11))
    assert again.attempts == 2
    # the second failure waits twice as long
    plan = plan_settlement(again, Outcome.retry(m.BROKER_5XX), events_settings(retry=policy))
    assert plan.delay_s == 20.0


def test_future_message_is_claimed_only_once_due(conn):
    t0 = db_now(conn)
    Outbox(EVENTS).enqueue(
        conn, Message(topic="t", payload={}, available_at=t0 + timedelta(seconds=30)), outside_transaction=True
    )
    outbox_table = OutboxTable(conn, EVENTS)
    assert outbox_table.claim("w", 1, 60, now=t0 + timedelta(seconds=29)) == []
    assert len(outbox_table.claim("w", 1, 60, now=t0 + timedelta(seconds=31))) == 1


def test_release_unsent_gives_the_attempt_back_and_is_fenced(conn):
    ids = enqueue_n(conn, EVENTS, 2)
    outbox_table = OutboxTable(conn, EVENTS)
    claimed = outbox_table.claim("w", 2, 60)
    assert outbox_table.release_unsent("someone-else", [(c.id, c.attempts) for c in claimed], "test") == set()
    assert outbox_table.release_unsent("w", [(c.id, c.attempts) for c in claimed], "released unsent: test") == set(ids)
    assert [(r["status"], r["attempts"], r["locked_by"]) for r in rows(conn, EVENTS)] == [("pending", 0, None)] * 2
    assert audit_codes(conn, EVENTS, ids[0]) == ["outbox_claim", "outbox_release"]
