"""Issue 43 (item 5): backfill_job is a dry run by default, as replay and skip are: it says what it would deliver
again (counts per topic, the first event ids, where to) and delivers and changes nothing; run for real, the
launch's reason is kept in its audit row."""

from datetime import timedelta

import pytest

from outbox_pipelines_tests.defs.conftest import op_metadata, run_job
from outbox_pipelines_tests.helpers import db_now, enqueue_n, statuses
from outbox_pipelines_tests.rows import make_sent

ORDERS = "outbox_orders"


def _config(**values) -> dict:
    return {"ops": {"backfill_op": {"config": {"table": ORDERS, **values}}}}


def _audits(conn) -> list[dict]:
    return conn.execute("SELECT worker, detail FROM outbox_audit WHERE code = 'outbox_backfill'").fetchall()


@pytest.fixture
def sent_today(conn) -> tuple[list[int], str]:
    """Five orders sent today (three order.created, two order.paid), one sent three days ago."""
    created = enqueue_n(conn, ORDERS, 3, prefix="bf-c-", topic="order.created")
    paid = enqueue_n(conn, ORDERS, 2, prefix="bf-p-", topic="order.paid")
    old = enqueue_n(conn, ORDERS, 1, prefix="bf-old-", topic="order.created")
    make_sent(conn, ORDERS, created + paid)
    make_sent(conn, ORDERS, old, age=timedelta(days=3))
    return created + paid, db_now(conn).date().isoformat()


def test_a_backfill_launched_as_the_launchpad_opens_delivers_nothing_and_says_what_it_would(
    conn, instance, resources, http_sink, monkeypatch, sent_today
):
    monkeypatch.setenv("OUTBOX_BROKER_URL", http_sink.url)  # outbox_orders' own destination
    ids, day = sent_today
    before = conn.execute(f"SELECT id, status, updated_at FROM {ORDERS} ORDER BY id").fetchall()
    result = run_job("backfill_job", resources, instance, _config(), partition_key=day)
    assert result.success
    meta = op_metadata(result, "backfill_op")
    assert (meta["dry_run"], meta["found"], meta["day"]) == (True, 5, day)
    assert meta["by_topic"] == {"order.created": 3, "order.paid": 2}
    assert meta["first_event_ids"] == ["bf-c-0", "bf-c-1", "bf-c-2", "bf-p-0", "bf-p-1"]  # the order it delivers in
    assert meta["summary"].startswith(f"dry run: would re-deliver 5 messages of {ORDERS} sent in [{day}T00:00:00")
    assert "(order.created 3, order.paid 2); nothing was delivered or changed" in meta["summary"]
    rows = meta["rows"]
    assert "Would re-deliver 5" in rows and "| order.created | 3 |" in rows and "| order.paid | 2 |" in rows
    assert f"| {ids[0]} | bf-c-0 | order.created |" in rows
    assert http_sink.received == []
    assert _audits(conn) == []
    assert conn.execute(f"SELECT id, status, updated_at FROM {ORDERS} ORDER BY id").fetchall() == before
    assert instance.get_run_by_id(result.run_id).tags["outbox/dry_run"] == "true"


def test_a_dry_run_lists_the_first_twenty_and_counts_them_all(conn, instance, resources, monkeypatch, http_sink):
    monkeypatch.setenv("OUTBOX_BROKER_URL", http_sink.url)
    make_sent(conn, ORDERS, enqueue_n(conn, ORDERS, 23, prefix="many-", topic="order.created"))
    result = run_job("backfill_job", resources, instance, _config(), partition_key=db_now(conn).date().isoformat())
    meta = op_metadata(result, "backfill_op")
    assert meta["found"] == 23 and len(meta["first_event_ids"]) == 20
    assert "the first 20 of 23" in meta["rows"]


def test_a_real_backfill_audits_its_reason(conn, instance, resources, http_sink, monkeypatch, sent_today):
    monkeypatch.setenv("OUTBOX_BROKER_URL", http_sink.url)
    _, day = sent_today
    config = _config(dry_run=False, reason="billing lost its copy of today (INC-7)")
    result = run_job("backfill_job", resources, instance, config, partition_key=day)
    assert result.success
    meta = op_metadata(result, "backfill_op")
    assert (meta["dry_run"], meta["found"], meta["delivered"]) == (False, 5, 5)
    assert len(http_sink.received) == 5
    [audit] = _audits(conn)
    assert audit["worker"] == f"dagster:{result.run_id[:8]}"
    assert audit["detail"].endswith("; 0 failed (billing lost its copy of today (INC-7))"), audit["detail"]
    assert instance.get_run_by_id(result.run_id).tags["outbox/dry_run"] == "false"
    assert statuses(conn, ORDERS) == {"sent": 6}
