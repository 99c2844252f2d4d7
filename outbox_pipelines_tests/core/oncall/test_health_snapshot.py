"""The health snapshot the checks read: what is waiting, how late, what died, at a bounded cost."""

import json
from datetime import timedelta

import pytest
from psycopg import ClientCursor
from psycopg.rows import tuple_row

from outbox_pipelines.core.oncall.health import LAG_SAMPLE, evaluate_checks, read_status
from outbox_pipelines.core.settings import CheckThresholds
from outbox_pipelines.core.storage.queries import table_query
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.helpers import db_now, enqueue_n
from outbox_pipelines_tests.rows import age_rows, make_dead, make_sent

EVENTS = "outbox_events"


def status_of(conn, *, now=None, count_sent=False, stuck_after_s=600.0, window_s=3600.0):
    return read_status(
        OutboxTable(conn, EVENTS), stuck_after_s=stuck_after_s, window_s=window_s, now=now, count_sent=count_sent
    )


def verdict(status, name, limits=None):
    return {v.name: v for v in evaluate_checks(status, limits or CheckThresholds())}[name]


def test_an_empty_table_is_healthy_and_every_check_passes(conn):
    status = status_of(conn)
    assert status.counts == {"pending": 0, "retrying": 0, "sending": 0, "sent": 0, "dead": 0}
    assert (status.oldest_waiting_age_s, status.lag_p95_s, status.lag_sample, status.stuck) == (None, None, 0, 0)
    verdicts = evaluate_checks(status, CheckThresholds())
    assert [v.name for v in verdicts] == [
        "lag",
        "dead_letters",
        "stuck",
        "backlog",
        "destination",
        "relay",
        "blocked_keys",
    ]
    assert all(v.severity == "ok" for v in verdicts), [(v.name, v.description) for v in verdicts]


def test_oldest_waiting_counts_a_row_in_retry_backoff(conn):
    """A message retrying in backoff is still waiting (the oldest waiting, the backlog), but not late until its
    backoff ends: from then on it is timed from when it became due, so an outage shows while it lasts."""
    [row_id] = enqueue_n(conn, EVENTS, 1)
    conn.execute(
        "UPDATE outbox_events SET attempts = 3, created_at = now() - interval '10 minutes', "
        "available_at = now() + interval '5 minutes', last_error_code = 'BROKER_5XX' WHERE id = %s",
        (row_id,),
    )
    due_at = conn.execute("SELECT available_at FROM outbox_events WHERE id = %s", (row_id,)).fetchone()["available_at"]
    status = status_of(conn)
    assert status.counts["retrying"] == 1 and status.counts["pending"] == 0
    assert status.ready == 0
    assert status.oldest_waiting_age_s == pytest.approx(600, abs=5)
    assert status.next_due_in_s == pytest.approx(300, abs=5)
    assert status.backlog == 1 and status.waiting == 1
    # In backoff: created 10 min ago, yet not due, so not late.
    assert (status.waiting_now, status.lag_now_s, status.lag_now_p95_s) == (0, 0, 0)
    lag = verdict(status, "lag")
    assert lag.severity == "ok", lag.description
    assert lag.description == (
        "outbox_events: nothing waiting, lag 0s (1 more not due yet: retrying after a backoff, scheduled, or "
        "behind an earlier message of their key)."
    )
    # Its backoff ended 10 s ago: it waits now, timed from then, not from its creation 15 min earlier.
    due = status_of(conn, now=due_at + timedelta(seconds=10))
    assert due.ready == 1 and due.waiting_now == 1
    assert due.lag_now_s == pytest.approx(10) and due.lag_now_p95_s == pytest.approx(10)
    assert due.oldest_waiting_age_s == pytest.approx(910, abs=5)
    assert verdict(due, "lag").severity == "ok"
    # Still not delivered 2 min after it became due: p95 past the 60 s warn threshold.
    late = status_of(conn, now=due_at + timedelta(seconds=120))
    assert late.lag_now_s == pytest.approx(120)
    lag = verdict(late, "lag")
    assert lag.severity == "warn"
    assert "messages wait too long" in lag.description and "1 waiting" in lag.description
    assert "oldest waiting message due 2 min ago" in lag.description
    # 5 min after: past the 300 s error threshold.
    assert verdict(status_of(conn, now=due_at + timedelta(seconds=300)), "lag").severity == "error"


def test_oldest_waiting_counts_an_in_flight_row(conn):
    """A row held in sending (created 20 min ago) counts, even when nothing is pending."""
    enqueue_n(conn, EVENTS, 1)
    OutboxTable(conn, EVENTS).claim("w", 1, 600)
    age_rows(conn, EVENTS, created=timedelta(minutes=20))
    status = status_of(conn)
    assert status.counts["sending"] == 1 and status.backlog == 0 and status.waiting == 1
    assert status.oldest_waiting_age_s == pytest.approx(1200, abs=5)
    assert status.stuck == 0  # its lease (600 s) is fine


def test_oldest_waiting_is_the_older_of_pending_and_in_flight(conn):
    ids = enqueue_n(conn, EVENTS, 2)
    OutboxTable(conn, EVENTS).claim("w", 1, 600)  # takes ids[0]
    age_rows(conn, EVENTS, ids[0], created=timedelta(seconds=100))
    age_rows(conn, EVENTS, ids[1], created=timedelta(seconds=400))
    assert status_of(conn).oldest_waiting_age_s == pytest.approx(400, abs=5)
    age_rows(conn, EVENTS, ids[0], created=timedelta(seconds=900))
    assert status_of(conn).oldest_waiting_age_s == pytest.approx(900, abs=5)


def test_lag_reflects_messages_still_waiting(conn):
    """Ten messages created 10 min ago and none sent: lag p95 is their age, not 'no data'."""
    enqueue_n(conn, EVENTS, 10)
    t0 = db_now(conn)
    later = status_of(conn, now=t0 + timedelta(seconds=600))
    assert later.lag_sample == 10
    assert later.lag_p95_s == pytest.approx(600, abs=5)
    assert later.lag_p50_s == pytest.approx(600, abs=5)
    assert verdict(later, "lag").severity == "error"  # 600 s >= lag_p95_error (300 s)
    # Two minutes in: past the 60 s warn threshold, not yet the 300 s error one (oldest 120 s < 300 s).
    sooner = status_of(conn, now=t0 + timedelta(seconds=120))
    assert sooner.lag_p95_s == pytest.approx(120, abs=5)
    lag = verdict(sooner, "lag")
    assert lag.severity == "warn"
    assert "lag p95 2 min (warn at 60 s)" in lag.description
    assert "10 waiting" in lag.description
    # Thirty seconds in: fine.
    assert verdict(status_of(conn, now=t0 + timedelta(seconds=30)), "lag").severity == "ok"


def test_lag_mixes_recent_deliveries_with_waiting_messages(conn):
    """90 delivered 1 s after creation plus 10 waiting for 10 min: p50 is fast, p95 shows the stragglers."""
    ids = enqueue_n(conn, EVENTS, 100)
    conn.execute(
        "UPDATE outbox_events SET status = 'sent', created_at = now() - interval '2 minutes', "
        "published_at = now() - interval '119 seconds' WHERE id = ANY(%s)",
        (ids[:90],),
    )
    age_rows(conn, EVENTS, ids[90:], created=timedelta(seconds=600))
    status = status_of(conn)
    assert status.lag_sample == 100
    assert status.lag_p50_s == pytest.approx(1, abs=0.5)
    assert status.lag_p95_s == pytest.approx(600, abs=5)


def test_sent_rows_outside_the_window_do_not_count(conn):
    ids = enqueue_n(conn, EVENTS, 30)
    # 20 delivered two hours ago, each after 1000 s: outside the 1 h window.
    conn.execute(
        "UPDATE outbox_events SET status = 'sent', created_at = now() - interval '7200 seconds' - "
        "interval '1000 seconds', published_at = now() - interval '7200 seconds' WHERE id = ANY(%s)",
        (ids[:20],),
    )
    # 10 delivered a minute ago, each after 2 s.
    conn.execute(
        "UPDATE outbox_events SET status = 'sent', created_at = now() - interval '62 seconds', "
        "published_at = now() - interval '60 seconds' WHERE id = ANY(%s)",
        (ids[20:],),
    )
    status = status_of(conn)
    assert status.lag_sample == 10
    assert status.lag_p95_s == pytest.approx(2, abs=0.5)
    assert status.lag_p99_s == pytest.approx(2, abs=0.5)
    assert verdict(status, "lag").severity == "ok"
    # A wider window takes the old deliveries in.
    wide = status_of(conn, window_s=3 * 3600)
    assert wide.lag_sample == 30
    assert wide.lag_p95_s == pytest.approx(1000, abs=5)


def test_counts_and_the_exact_sent_count(conn):
    ids = enqueue_n(conn, EVENTS, 12)
    make_sent(conn, EVENTS, ids[:5])
    make_dead(conn, EVENTS, ids[5:7], code="BAD_REQUEST")
    conn.execute("UPDATE outbox_events SET attempts = 2 WHERE id = %s", (ids[7],))
    OutboxTable(conn, EVENTS).claim("w", 1, 60)  # ids[7] (lowest ready id) goes in flight
    status = status_of(conn)
    # sent is not counted by default (a full scan), only on request
    assert status.counts == {"pending": 4, "retrying": 0, "sending": 1, "sent": 0, "dead": 2}
    assert status_of(conn, count_sent=True).counts == {"pending": 4, "retrying": 0, "sending": 1, "sent": 5, "dead": 2}
    assert status.ready == 4
    backlog = verdict(status, "backlog", CheckThresholds(backlog_warn=4, backlog_error=10))
    assert backlog.severity == "warn"
    assert backlog.metadata["backlog"] == 4


def test_dead_by_code_and_the_dead_letters_check(conn):
    ids = enqueue_n(conn, EVENTS, 6)
    make_dead(conn, EVENTS, ids[:3], code="BROKER_5XX")
    make_dead(conn, EVENTS, ids[3], code="BAD_REQUEST")
    make_dead(conn, EVENTS, ids[4], code=None)
    status = status_of(conn)
    assert status.counts["dead"] == 5
    assert status.dead_by_code == {"BROKER_5XX": 3, "BAD_REQUEST": 1, "UNKNOWN": 1}
    assert next(iter(status.dead_by_code)) == "BROKER_5XX"  # the biggest first
    dead = verdict(status, "dead_letters")
    assert dead.severity == "warn"
    assert "5 dead messages" in dead.description
    assert "BROKER_5XX=3" in dead.description
    assert f"outbox-pipelines replay --table {EVENTS} --error-code BROKER_5XX --dry-run" in dead.description
    assert dead.metadata["dead_BROKER_5XX"] == 3
    assert verdict(status, "dead_letters", CheckThresholds(dead_warn=1, dead_error=5)).severity == "error"


def test_stuck_rows_past_their_lease_or_the_threshold(conn):
    enqueue_n(conn, EVENTS, 3)
    outbox_table = OutboxTable(conn, EVENTS)
    outbox_table.claim("gone", 1, 5)  # lease 5 s
    outbox_table.claim("slow", 1, 3600)  # lease 1 h
    outbox_table.claim("fine", 1, 3600)
    t0 = db_now(conn)
    assert status_of(conn, now=t0).stuck == 0
    # 10 s later the 5 s lease expired
    later = status_of(conn, now=t0 + timedelta(seconds=10))
    assert (later.stuck, later.counts["sending"]) == (1, 3)
    stuck = verdict(later, "stuck")
    assert stuck.severity == "warn"
    assert f"outbox-pipelines requeue-stuck --table {EVENTS}" in stuck.description
    # past the stuck threshold (untouched for 700 s > 600 s) every held row is stuck
    assert status_of(conn, now=t0 + timedelta(seconds=700)).stuck == 3
    assert status_of(conn, now=t0 + timedelta(seconds=700), stuck_after_s=3600).stuck == 1


def _plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


def test_the_snapshot_reads_indexes_not_the_whole_table(conn):
    """Cost, not timing: with 200,000 sent rows kept, no step of the snapshot scans the outbox table."""
    conn.execute("""
        INSERT INTO outbox_events (event_id, topic, payload, payload_sha, status, attempts, created_at,
                                   published_at, updated_at)
        SELECT 'bulk-' || g, 't', '{}'::jsonb, 'sha256:' || g, 'sent', 1,
               now() - make_interval(secs => 200000 - g + 5), now() - make_interval(secs => 200000 - g),
               now() - make_interval(secs => 200000 - g)
        FROM generate_series(1, 200000) AS g
    """)
    ids = enqueue_n(conn, EVENTS, 20)
    make_dead(conn, EVENTS, ids[:5], code="BAD_REQUEST")
    OutboxTable(conn, EVENTS).claim("w", 5, 60)
    conn.execute("ANALYZE outbox_events")
    query = table_query("outbox_health_snapshot", EVENTS)
    params = {
        "table_name": EVENTS,
        "stuck_after_s": 600.0,
        "window_s": 3600.0,
        "sample": LAG_SAMPLE,
        "now": None,
        "paused_topics": [],
    }
    with ClientCursor(conn, row_factory=tuple_row) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
        raw = cur.fetchone()[0]
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    on_outbox = [n for n in _plan_nodes(plan) if n.get("Relation Name") == EVENTS]
    assert on_outbox, "the plan does not read the outbox table?"
    problems = []
    for node in on_outbox:
        # Not a timing: the rows a step went through, against the 200,000 sent rows kept.
        touched = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
        if node["Node Type"] == "Seq Scan" or touched > 20_000:
            problems.append(
                f"{node['Node Type']} on {EVENTS} via {node.get('Index Name', '-')} "
                f"(filter {node.get('Filter', '-')}): {touched:,.0f} rows gone through"
            )
    assert not problems, "the snapshot's cost grows with the sent rows kept:\n" + "\n".join(problems)
    # and the answer is still right
    status = status_of(conn)
    assert status.counts == {"pending": 10, "retrying": 0, "sending": 5, "sent": 0, "dead": 5}
    # the deliveries of the last hour (one a second, give or take the seconds this test took) plus the 15 waiting
    assert 3560 + 15 <= status.lag_sample <= 3601 + 15
