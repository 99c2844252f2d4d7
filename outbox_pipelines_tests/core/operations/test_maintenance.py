"""Stuck requeue, cleaner and replay: what an operator runs, checked in the database."""

from datetime import timedelta

from outbox_pipelines.core.operations.maintenance import clean, clean_shared, requeue_stuck
from outbox_pipelines.core.operations.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import audit_codes, db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.rows import make_dead, make_sent

EVENTS = "outbox_events"


def set_rows(conn, sql: str, *params) -> None:
    conn.execute(sql, params)


def test_requeue_returns_expired_leases_and_kills_rows_out_of_attempts(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 3)
    outbox_table = OutboxTable(conn, EVENTS)
    outbox_table.claim("crashed-worker", 3, 30)
    set_rows(conn, "UPDATE outbox_events SET attempts = 5 WHERE id = %s", ids[2])
    settings = table_settings(EVENTS, retry=RetryPolicy(base_s=1, max_s=10, max_attempts=5, jitter=0))
    t0 = db_now(conn)
    assert requeue_stuck(db_url, settings, now=t0 + timedelta(seconds=29)).requeued == 0
    report = requeue_stuck(db_url, settings, now=t0 + timedelta(seconds=31))
    assert (report.requeued, report.dead) == (2, 1)
    by_id = {r["id"]: r for r in rows(conn, EVENTS)}
    assert [by_id[i]["status"] for i in ids] == ["pending", "pending", "dead"]
    assert by_id[ids[0]]["locked_by"] is None and by_id[ids[0]]["attempts"] == 1
    assert by_id[ids[2]]["last_error_code"] == "LEASE_EXPIRED"
    assert "crashed-worker" in by_id[ids[2]]["last_error"]
    assert audit_codes(conn, EVENTS, ids[0]) == ["outbox_claim", "outbox_requeue"]
    assert audit_codes(conn, EVENTS, ids[2]) == ["outbox_claim", "outbox_flush_dead"]


def test_requeue_by_stuck_threshold_even_with_a_long_lease(db_url, conn):
    enqueue_n(conn, EVENTS, 1)
    OutboxTable(conn, EVENTS).claim("w", 1, 3600)
    settings = table_settings(EVENTS, stuck_threshold_s=600)
    t0 = db_now(conn)
    assert requeue_stuck(db_url, settings, now=t0 + timedelta(seconds=599)).requeued == 0
    assert requeue_stuck(db_url, settings, now=t0 + timedelta(seconds=601)).requeued == 1


def test_cleaner_deletes_only_old_sent_rows(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 6)
    t0 = db_now(conn)
    # old sent, recent sent, pending, dead (old), sending (old), retrying
    make_sent(conn, EVENTS, ids[0], published_at=t0 - timedelta(days=8))
    make_sent(conn, EVENTS, ids[1], published_at=t0 - timedelta(days=6))
    make_dead(conn, EVENTS, ids[3], code=None, at=t0 - timedelta(days=30))
    set_rows(
        conn,
        "UPDATE outbox_events SET status = 'sending', locked_by = 'w', updated_at = %s WHERE id = %s",
        t0 - timedelta(days=9),
        ids[4],
    )
    set_rows(conn, "UPDATE outbox_events SET attempts = 2 WHERE id = %s", ids[5])
    report = clean(db_url, table_settings(EVENTS), retention_s=7 * 86400)
    assert report.deleted_sent == 1
    assert [r["id"] for r in rows(conn, EVENTS)] == ids[1:]
    summary = conn.execute("SELECT detail FROM outbox_audit WHERE code = 'outbox_clean'").fetchone()
    assert summary["detail"] == f"deleted 1 sent rows, ids {ids[0]}..{ids[0]}"


def test_cleaner_works_in_bounded_batches_until_done(db_url, conn):
    enqueue_n(conn, EVENTS, 25)
    make_sent(conn, EVENTS, age=timedelta(days=10))
    report = clean(db_url, table_settings(EVENTS), retention_s=86400, batch_size=10)
    assert (report.deleted_sent, report.batches) == (25, 3)
    assert rows(conn, EVENTS) == []


def test_cleaner_removes_expired_ledger_rows(db_url, conn):
    conn.execute(
        "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) VALUES "
        "('old', 'sha256:a', now() - interval '1 minute'), ('fresh', 'sha256:b', now() + interval '47 hours')"
    )
    report = clean_shared(db_url, audit_retention_s=None)
    assert report.deleted_expired == {"idempo_ledger": 1}
    assert [r["idempotency_key"] for r in conn.execute("SELECT idempotency_key FROM idempo_ledger")] == ["fresh"]


def test_clean_shared_removes_old_audit_rows_in_batches_only_when_asked(db_url, conn):
    conn.execute(
        "INSERT INTO outbox_audit (outbox_table, code, worker, created_at) "
        "SELECT 'outbox_events', 'outbox_claim', 'w', now() - interval '40 days' FROM generate_series(1, 12)"
    )
    conn.execute("INSERT INTO outbox_audit (outbox_table, code, worker) VALUES ('outbox_events', 'outbox_claim', 'w')")
    assert clean_shared(db_url, audit_retention_s=None).deleted_audit == 0
    report = clean_shared(db_url, audit_retention_s=30 * 86400, batch_size=5)
    assert report.deleted_audit == 12
    assert conn.execute("SELECT count(*) AS n FROM outbox_audit").fetchone()["n"] == 1
    # database time: moved 31 days on, the remaining row is old too
    later = db_now(conn) + timedelta(days=31)
    assert clean_shared(db_url, audit_retention_s=30 * 86400, now=later).deleted_audit == 1


def _dead(conn, ids, code, topic=None, tenant=None, when=None):
    for i in ids:
        conn.execute(
            "UPDATE outbox_events SET status = 'dead', attempts = 3, last_error_code = %s, last_error = 'boom', "
            "topic = coalesce(%s, topic), tenant_id = %s, updated_at = coalesce(%s, now()) WHERE id = %s",
            (code, topic, tenant, when, i),
        )


def test_replay_filters_dry_run_and_bad_request_guard(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 8)
    t0 = db_now(conn)
    _dead(conn, ids[0:2], "BROKER_5XX", topic="a", tenant="t1")
    _dead(conn, ids[2:4], "NETWORK_TIMEOUT", topic="b", tenant="t2", when=t0 - timedelta(days=2))
    _dead(conn, ids[4:6], "BAD_REQUEST", topic="a", tenant="t1")

    dry = replay_dead(db_url, EVENTS, ReplayFilter(topic="a"), dry_run=True)
    assert (dry.matched, dry.replayed, dry.refused) == (4, 0, 2)
    assert statuses(conn, EVENTS) == {"dead": 6, "pending": 2}

    tenant_t2 = ReplayFilter(tenant_id="t2", until=t0 - timedelta(days=1))
    assert replay_dead(db_url, EVENTS, tenant_t2).replayed_ids == ids[2:4]
    assert replay_dead(db_url, EVENTS, ReplayFilter(error_code="BROKER_5XX")).replayed_ids == ids[0:2]
    guarded = replay_dead(db_url, EVENTS, ReplayFilter(ids=tuple(ids[4:6])))
    assert (guarded.replayed, guarded.refused, guarded.refused_ids) == (0, 2, ids[4:6])
    assert "use --force" in guarded.summary
    forced = replay_dead(db_url, EVENTS, ReplayFilter(ids=(ids[4],)), force=True)
    assert forced.replayed_ids == [ids[4]]

    replayed = rows(conn, EVENTS, f"id = {ids[0]}")[0]
    assert (replayed["status"], replayed["attempts"], replayed["last_error_code"]) == ("pending", 0, None)
    audit = conn.execute(
        "SELECT error_code, detail, worker FROM outbox_audit WHERE code = 'outbox_replay' AND message_id = %s",
        (ids[0],),
    ).fetchone()
    assert (audit["error_code"], audit["detail"], audit["worker"]) == ("BROKER_5XX", "boom", "replay")


def test_replay_matching_nothing_reports_zero(db_url, conn):
    enqueue_n(conn, EVENTS, 2)
    report = replay_dead(db_url, EVENTS, ReplayFilter(topic="nope"))
    assert (report.matched, report.replayed) == (0, 0)
    assert statuses(conn, EVENTS) == {"pending": 2}


def test_replay_pages_through_many_rows(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 25)
    _dead(conn, ids, "BROKER_5XX")
    report = replay_dead(db_url, EVENTS, ReplayFilter(error_code="BROKER_5XX"), batch_size=10)
    assert report.replayed == 25
    assert statuses(conn, EVENTS) == {"pending": 25}
