"""latency: commit → handler at a steady rate, woken by LISTEN/NOTIFY.

A producer process commits one enqueue every 1/rate seconds (a schedule of
absolute times, so a late commit does not shift the ones after it). A consumer
process records when each message reaches its handler:

- ours: ``Relay(...).run(max_seconds=...)`` with a HandlerDestination whose
  handler notes the time (the shipped outbox_events settings: single-active,
  batch 100, idle sleep 200 ms, woken by NOTIFY);
- ceiling: a bare loop that LISTENs on the same channel and, on each NOTIFY,
  runs the claim + settle SQL itself until a claim comes back empty.

Clock choice: the producer reads ``time.monotonic()`` right after ``commit()``
returns, into a side dict keyed by event_id; the handler reads the same clock
(CLOCK_MONOTONIC is system-wide on Linux, so the two processes compare). That
leaves out the commit's own return trip, so a latency is slightly *under*-
stated, equally for both consumers; a message handled before the producer's
clock read shows as a small negative latency and is kept as is.
"""

import time
from typing import Any

import psycopg
from psycopg import sql

from obench import ceiling_sql
from obench.common import (
    Barrier,
    Figure,
    ScenarioResult,
    Sizes,
    Target,
    count_by_status,
    log,
    percentile,
    reset_table,
    run_processes,
    sample_payload,
    settle_server,
)

TABLE = "outbox_events"
TOPIC = "bench.latency"
# The consumer is released with the producer; the producer waits this long first
# so the consumer has connected and is LISTENing before the first commit.
PRODUCER_HEAD_START_S = 0.5
# Messages of the first half second are warm-up (connection, statement preparation).
WARM_UP_S = 0.5
# A consumer stops once it has handled every message the producer will commit;
# this deadline only ends a run that lost messages (the producer may fall behind
# its schedule on a busy machine, so it is generous).
DEADLINE_FACTOR, DEADLINE_SLACK_S = 3.0, 10.0


def producer(url: str, rate: float, seconds: float, barrier: Barrier) -> tuple[str, dict[str, float]]:
    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message

    outbox = Outbox(TABLE)
    count = int(rate * seconds)
    messages = [Message(topic=TOPIC, payload=sample_payload(n), event_id=f"lat-{n}") for n in range(count)]
    committed: dict[str, float] = {}
    with psycopg.connect(url) as conn:
        barrier()
        time.sleep(PRODUCER_HEAD_START_S)
        start = time.monotonic()
        for n, message in enumerate(messages):
            due = start + n / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            outbox.enqueue(conn, message)
            conn.commit()
            committed[message.event_id] = time.monotonic()
    return "producer", committed


def ours_consumer(
    url: str, expected: int, seconds: float, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
    from outbox_pipelines.core.models import ClaimedMessage
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    delivered: dict[str, float] = {}

    def handler(message: ClaimedMessage) -> None:
        delivered[message.event_id] = time.monotonic()
        if len(delivered) >= expected:
            relay.request_stop()  # finishes and settles this batch, then returns

    registry = HandlerRegistry()
    registry.register(TOPIC, handler)
    # The shipped outbox_events table: in-process handlers, single-active relay,
    # default batch (100) and idle sleep (200 ms); NOTIFY is what makes it prompt.
    table = TableSettings(name=TABLE, destination="handlers", mode="single-active")
    relay = Relay(url, table, HandlerDestination(registry), worker_id="bench-latency-ours")
    barrier()
    report = relay.run(max_seconds=seconds)
    return "consumer", delivered, {"batches": report.batches, "sent": report.sent, "stopped": report.stopped_because}


def bare_consumer(
    url: str, expected: int, seconds: float, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    delivered: dict[str, float] = {}
    worker = "bench-latency-bare"
    claim, settle = ceiling_sql.bind(ceiling_sql.CLAIM, TABLE), ceiling_sql.bind(ceiling_sql.SETTLE, TABLE)
    params = {"now": None, "paused_topics": [], "limit": 100, "worker": worker, "lease_s": 60.0, "table_name": TABLE}
    batches = 0
    barrier()
    deadline = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True, options=ceiling_sql.SESSION_OPTIONS) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"outbox:{TABLE}")))
        while len(delivered) < expected and time.monotonic() < deadline:
            # Drain: claim until empty. NOTIFYs that arrive meanwhile wait in
            # psycopg's backlog and end the next wait at once.
            while True:
                rows = conn.execute(claim, params).fetchall()
                if not rows:
                    break
                now = time.monotonic()
                for row in rows:
                    delivered[row[1]] = now
                n = len(rows)
                conn.execute(
                    settle,
                    {
                        "now": None, "worker": worker, "table_name": TABLE,
                        "ids": [r[0] for r in rows], "attempts": [r[7] for r in rows],
                        "statuses": ["sent"] * n, "delays": [0.0] * n, "error_codes": [None] * n,
                        "errors": [None] * n, "refs": [None] * n, "audit_codes": ["outbox_flush_success"] * n,
                        "delete_ids": [], "delete_attempts": [], "delete_audit_codes": [], "delete_error_codes": [],
                    },
                ).fetchall()
                batches += 1
            for _ in conn.notifies(timeout=max(min(0.25, deadline - time.monotonic()), 0.0), stop_after=1):
                pass
    return "consumer", delivered, {"batches": batches, "sent": len(delivered)}


def measure(url: str, kind: str, sizes: Sizes) -> dict[str, Any]:
    reset_table(url, TABLE)
    settle_server(url, TABLE)
    consumer = ours_consumer if kind == "ours" else bare_consumer
    expected = int(sizes.latency_rate * sizes.latency_seconds)
    deadline_s = PRODUCER_HEAD_START_S + sizes.latency_seconds * DEADLINE_FACTOR + DEADLINE_SLACK_S
    results = run_processes(
        [(consumer, (url, expected, deadline_s)), (producer, (url, sizes.latency_rate, sizes.latency_seconds))],
        timeout_s=deadline_s + 60,
    )
    committed = next(r[1] for r in results if r[0] == "producer")
    delivered, info = next((r[1], r[2]) for r in results if r[0] == "consumer")
    skip = int(WARM_UP_S * sizes.latency_rate)
    measured = [eid for n, eid in enumerate(committed) if n >= skip]
    missing = [eid for eid in measured if eid not in delivered]
    latencies_ms = [(delivered[eid] - committed[eid]) * 1000.0 for eid in measured if eid in delivered]
    counts = count_by_status(url, TABLE)
    first, last = list(committed.values())[0], list(committed.values())[-1]
    return {
        "p50": percentile(latencies_ms, 50),
        "p95": percentile(latencies_ms, 95),
        "p99": percentile(latencies_ms, 99),
        "max": max(latencies_ms) if latencies_ms else float("nan"),
        "messages": len(latencies_ms),
        "missing": len(missing),
        "achieved_rate": (len(committed) - 1) / (last - first) if last > first else 0.0,
        "table": counts,
        **info,
    }


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    stats: dict[str, list[dict[str, Any]]] = {"ours": [], "bare": []}
    for run_index in range(runs):
        order = ("ours", "bare") if run_index % 2 == 0 else ("bare", "ours")
        for kind in order:
            m = measure(url, kind, sizes)
            stats[kind].append(m)
            log(
                f"  latency run {run_index + 1}/{runs} {kind:5s} p50 {m['p50']:6.2f} ms  p95 {m['p95']:6.2f} ms  "
                f"p99 {m['p99']:6.2f} ms  ({m['messages']:,} msgs at {m['achieved_rate']:.0f}/s, "
                f"{m['missing']} missing)"
            )
            if m["achieved_rate"] < 0.9 * sizes.latency_rate:
                log(f"  WARNING: the producer fell behind its schedule ({m['achieved_rate']:.0f}/s): "
                    "the machine is busy")
            if m["missing"]:
                raise RuntimeError(f"latency {kind}: {m['missing']} committed messages never reached the handler")
    label = f"latency commit→handler at {sizes.latency_rate:.0f} msg/s, {sizes.latency_seconds:.0f} s"
    for quantile in ("p50", "p95"):
        result.figures.append(
            Figure(
                "latency",
                f"{label}: {quantile}",
                "ms",
                [m[quantile] for m in stats["ours"]],
                [m[quantile] for m in stats["bare"]],
                "bare LISTEN + claim/settle loop",
                note="for information",
            )
        )
    result.figures.append(
        Figure(
            "latency",
            f"{label}: p99",
            "ms",
            [m["p99"] for m in stats["ours"]],
            [m["p99"] for m in stats["bare"]],
            "bare LISTEN + claim/settle loop",
            Target("≤ 1.5× ceiling and ≤ 15 ms", ratio_max=1.5, value_max=15.0),
        )
    )
    result.details["runs"] = stats
    return result
