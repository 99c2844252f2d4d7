"""backfill.redeliver_sent: the sent messages of a window delivered again, with their own keys, rows untouched.

redeliver_sent has no dry run and moves no row back to pending: rows stay sent, the
destination sees each message again with the same event_id (its idempotency key),
and one audit row records what was done.
"""

from datetime import UTC, datetime, timedelta

import pytest

from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.operations.backfill import redeliver_sent
from outbox_pipelines_tests.helpers import ScriptedDestination, db_now, enqueue_n, rows
from outbox_pipelines_tests.rows import make_dead, make_sent

EVENTS = "outbox_events"


def mark_sent(conn, ids, published_at) -> None:
    make_sent(conn, EVENTS, ids, published_at=published_at, attempts=1)


def backfill_audit(conn) -> list[dict]:
    return conn.execute(
        "SELECT outbox_table, message_id, worker, detail FROM outbox_audit WHERE code = 'outbox_backfill' ORDER BY id"
    ).fetchall()


def test_only_rows_sent_inside_the_window_are_delivered_again_and_stay_sent(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 7)
    t0 = db_now(conn)
    start, end = t0 - timedelta(hours=2), t0 - timedelta(hours=1)
    mark_sent(conn, ids[0:2], start)  # at the start: inside
    mark_sent(conn, [ids[2]], end - timedelta(seconds=1))  # just before the end: inside
    mark_sent(conn, [ids[3]], end)  # at the end: outside, the window is [start, end)
    mark_sent(conn, [ids[4]], start - timedelta(seconds=1))  # before the start: outside
    make_dead(conn, EVENTS, ids[5], code=None, at=start)
    # ids[6] stays pending
    before = {r["id"]: r for r in rows(conn, EVENTS)}
    destination = ScriptedDestination()

    report = redeliver_sent(db_url, EVENTS, destination, start, end)

    assert [m.id for m in destination.calls] == ids[0:3]
    assert [m.event_id for m in destination.calls] == ["e0", "e1", "e2"]  # the same idempotency keys
    assert [m.payload for m in destination.calls] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert (report.found, report.delivered, report.failed) == (3, 3, 0)
    assert rows(conn, EVENTS) == [before[i] for i in ids]  # nothing changed: sent rows stay sent


def test_failures_are_counted_by_code_with_their_ids(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 4)
    t0 = db_now(conn)
    mark_sent(conn, ids, t0 - timedelta(minutes=5))
    failing = {ids[1]: Outcome.retry("BROKER_5XX", "503"), ids[3]: Outcome.dead("BAD_REQUEST", "400")}
    destination = ScriptedDestination(lambda m: failing.get(m.id, Outcome.sent()))

    report = redeliver_sent(db_url, EVENTS, destination, t0 - timedelta(hours=1), t0)

    assert (report.found, report.delivered, report.failed) == (4, 2, 2)
    assert report.failed_ids == [ids[1], ids[3]]
    assert report.failures_by_code == {"BROKER_5XX": 1, "BAD_REQUEST": 1}
    assert {r["status"] for r in rows(conn, EVENTS)} == {"sent"}  # a failed re-delivery changes no row


def test_pages_through_a_large_window_and_reports_progress(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 25)
    t0 = db_now(conn)
    mark_sent(conn, ids, t0 - timedelta(minutes=1))
    destination = ScriptedDestination()
    said: list[str] = []

    report = redeliver_sent(
        db_url, EVENTS, destination, t0 - timedelta(hours=1), t0, batch_size=10, progress=said.append
    )

    assert report.found == 25 and [m.id for m in destination.calls] == ids  # each once, in id order
    assert said == [f"{EVENTS}: {n} sent messages re-delivered so far (0 failed)" for n in (10, 20, 25)]


def test_one_audit_row_says_what_was_redelivered_where_and_by_whom(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 3)
    t0 = db_now(conn)
    mark_sent(conn, ids, t0 - timedelta(minutes=1))
    start, end = t0 - timedelta(hours=1), t0 + timedelta(seconds=1)
    destination = ScriptedDestination(lambda m: Outcome.retry("NETWORK_TIMEOUT") if m.id == ids[0] else Outcome.sent())

    redeliver_sent(db_url, EVENTS, destination, start, end, actor="dagster:1234abcd")

    [audit] = backfill_audit(conn)
    assert (audit["outbox_table"], audit["message_id"], audit["worker"]) == (EVENTS, None, "dagster:1234abcd")
    assert audit["detail"] == (
        f"re-delivered 2 of 3 sent messages published in [{start.isoformat()}, {end.isoformat()}) to scripted; 1 failed"
    )


def test_an_empty_window_delivers_nothing_and_still_records_the_backfill(db_url, conn):
    enqueue_n(conn, EVENTS, 2)  # pending, never sent
    t0 = db_now(conn)
    destination = ScriptedDestination()

    report = redeliver_sent(db_url, EVENTS, destination, t0 - timedelta(days=1), t0)

    assert (report.found, report.delivered, report.failed, destination.calls) == (0, 0, 0, [])
    [audit] = backfill_audit(conn)
    assert audit["detail"].startswith("re-delivered 0 of 0 sent messages") and audit["worker"] == "backfill"


def test_an_unknown_table_says_how_to_create_it(db_url):
    with pytest.raises(UnknownTable, match="db create-table hrm_outbox"):
        redeliver_sent(
            db_url,
            "hrm_outbox",
            ScriptedDestination(),
            datetime(2026, 1, 1, tzinfo=UTC),
            datetime(2026, 1, 2, tzinfo=UTC),
        )
