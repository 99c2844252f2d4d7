"""drain: pending messages claimed, delivered to a no-op destination and settled.

Ours: ``Relay(url, settings, NoopDestination()).run(once=True)`` in each worker
process. Ceiling: a bare psycopg 3 loop sending the same claim and settle
statements (obench.ceiling_sql) with nothing else around them.
"""

import time
from typing import Any

import psycopg

from obench import ceiling_sql
from obench.common import (
    Barrier,
    Figure,
    NoopDestination,
    ScenarioResult,
    Sizes,
    Target,
    copy_rows,
    count_by_status,
    log,
    make_rows,
    reset_table,
    run_processes,
    settle_server,
)

TABLE = "outbox_orders"
AUDIT_SUCCESS = "outbox_flush_success"


def ours_worker(url: str, table_name: str, batch: int, index: int, barrier: Barrier) -> tuple[float, float, int]:
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    table = TableSettings(name=table_name, mode="competing", batch_size=batch, on_success="mark_sent")
    relay = Relay(url, table, NoopDestination(), worker_id=f"bench-ours-{index}")
    barrier()
    started = time.monotonic()
    report = relay.run(once=True)
    return started, time.monotonic(), report.sent


def ceiling_drain(conn: psycopg.Connection, table_name: str, batch: int, worker: str) -> int:
    """Claim a batch, 'deliver' it, settle it as sent; until a claim comes back empty."""
    claim = ceiling_sql.bind(ceiling_sql.CLAIM, table_name)
    settle = ceiling_sql.bind(ceiling_sql.SETTLE, table_name)
    claim_params = {"now": None, "paused_topics": [], "limit": batch, "worker": worker, "lease_s": 60.0,
                    "table_name": table_name}
    sent = 0
    while True:
        rows = conn.execute(claim, claim_params).fetchall()
        if not rows:
            return sent
        n = len(rows)
        conn.execute(
            settle,
            {
                "now": None,
                "worker": worker,
                "table_name": table_name,
                "ids": [r[0] for r in rows],
                "attempts": [r[7] for r in rows],
                "statuses": ["sent"] * n,
                "delays": [0.0] * n,
                "error_codes": [None] * n,
                "errors": [None] * n,
                "refs": [None] * n,
                "audit_codes": [AUDIT_SUCCESS] * n,
                "delete_ids": [], "delete_attempts": [], "delete_audit_codes": [], "delete_error_codes": [],
            },
        ).fetchall()
        sent += n


def ceiling_worker(url: str, table_name: str, batch: int, index: int, barrier: Barrier) -> tuple[float, float, int]:
    barrier()
    started = time.monotonic()
    # Connecting is inside the clock, as it is inside Relay.run for ours.
    with psycopg.connect(url, autocommit=True, options=ceiling_sql.SESSION_OPTIONS) as conn:
        sent = ceiling_drain(conn, table_name, batch, f"bench-ceiling-{index}")
    return started, time.monotonic(), sent


def drain_once(url: str, kind: str, workers: int, rows: list[Any], batch: int) -> float:
    """Load the rows, drain them with ``workers`` processes; return messages per second."""
    reset_table(url, TABLE)
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, TABLE, rows)
    settle_server(url, TABLE)
    func = ours_worker if kind == "ours" else ceiling_worker
    results = run_processes([(func, (url, TABLE, batch, i)) for i in range(workers)], timeout_s=600)
    started = min(r[0] for r in results)
    finished = max(r[1] for r in results)
    sent = sum(r[2] for r in results)
    counts = count_by_status(url, TABLE)
    if sent != len(rows) or counts.get("sent", 0) != len(rows):
        raise RuntimeError(f"drain {kind} x{workers}: {sent} reported sent, table has {counts}, expected {len(rows)}")
    return sent / (finished - started)


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    rows = make_rows(sizes.drain_messages, "order.created", "drain")
    drift = ceiling_sql.drift()
    result.details["ceiling_sql_matches_core"] = drift
    if not all(drift.values()):
        log(f"  WARNING: the core's claim/settle SQL differs from the ceiling's copy: {drift}")
    for workers in (1, 4):
        ours: list[float] = []
        ceiling: list[float] = []
        for run_index in range(runs):
            # Alternate which side goes first, so slow drift of the machine cancels out.
            order = ("ours", "ceiling") if run_index % 2 == 0 else ("ceiling", "ours")
            for kind in order:
                rate = drain_once(url, kind, workers, rows, sizes.drain_batch)
                (ours if kind == "ours" else ceiling).append(rate)
                log(f"  drain x{workers} run {run_index + 1}/{runs} {kind:8s} {rate:9,.0f} msg/s")
        result.figures.append(
            Figure(
                "drain",
                f"drain, {workers} worker{'s' if workers > 1 else ''} (batch {sizes.drain_batch:,}, "
                f"{sizes.drain_messages:,} msgs)",
                "msg/s",
                ours,
                ceiling,
                "bare psycopg loop, same claim+settle SQL",
                Target("≥ 0.8× ceiling", ratio_min=0.8),
            )
        )
    return result
