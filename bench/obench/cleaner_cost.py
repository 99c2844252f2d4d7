"""cleaner: what DELETE-based cleaning costs at scale, and whether it keeps up (issue 12, item 5).

The case: a table at 5,000 msg/s keeps ``cleaner_sent_rows`` sent rows (10,000,000
by default) because its cleaner is a day behind: ``published_at`` is spread evenly
over the last 48 hours, so half the rows are older than a 1-day retention. Three
questions, on that one table:

1. Does keeping them slow the relay's claim? Claims of 1,000 through the core's
   ``OutboxTable.claim`` alternate between the full table and an empty twin (as
   in flat.py); target within ±25 %.
2. How fast does the cleaner delete, alone? The core's own loop
   (``OutboxTable.clean_sent`` with a 1-day retention, batches of 5,000, the
   statement ``maintenance.clean`` runs) for ``cleaner_seconds``; rows/s and the
   per-batch time. Target: at least 5,000 rows/s, the arrival rate, or the
   backlog can only grow.
3. And while a relay drains at the same time? The cleaner loop in one process,
   drain.py's ``ours_worker`` (defaults, competing mode) in another, both on the
   big table, both stopped when the relay has drained its backlog. Same target.

The cleaner passes run once per invocation: each consumes the finite backlog of
day-old rows, so a repeat would measure a different table. The claim timing
repeats ``runs`` times. Both tables are dropped at the end, so a later scenario
does not pay for ten million rows.
"""

import multiprocessing.synchronize
import time
from typing import Any

import psycopg
from psycopg import sql

from obench import drain
from obench.common import (
    SPAWN,
    Barrier,
    Figure,
    ScenarioResult,
    Sizes,
    Target,
    copy_rows,
    iter_rows,
    log,
    make_rows,
    percentile,
    run_processes,
    settle_server,
)

FULL, EMPTY = "bench_big", "bench_big_empty"
CHUNK = 1_000_000  # rows per INSERT ... SELECT generate_series statement
SPAN_S = 48 * 3600.0  # published_at spread over the last 48 hours
RETENTION_S = 86_400.0  # a 1-day retention: half the rows are due
CLEAN_BATCH = 5_000  # maintenance.clean's default batch_size
ARRIVAL_RATE = 5_000.0  # msg/s sustained: the cleaner must delete at least this fast
CLAIM_BATCH = 1_000
CLAIMS = 10  # claims per run on each table
WORKER = "bench-cleaner"

# One INSERT of sent rows g = lo..hi out of n. The payload has sample_payload's
# shape and size (about 250 bytes of JSON), like the pending rows the relay drains,
# so the heap is as wide as a real table's; the newest row is published at %(end)s.
_INSERT_SENT = """
INSERT INTO {} (event_id, topic, payload, payload_sha, headers, status, attempts,
                created_at, updated_at, published_at, result_ref)
SELECT 'sent-' || g, 'order.created',
       jsonb_build_object(
           'order_id', 'ord-' || lpad(g::text, 9, '0'),
           'customer_id', 'cus-' || lpad((g %% 9973)::text, 5, '0'),
           'amount_cents', 1000 + g %% 50000,
           'currency', 'EUR',
           'lines', jsonb_build_array(jsonb_build_object('sku', 'sku-' || g %% 311, 'qty', 1 + g %% 3),
                                      jsonb_build_object('sku', 'sku-' || g %% 127, 'qty', 1)),
           'note', 'benchmark message'),
       'sha256:' || encode(sha256(g::text::bytea), 'hex'),
       jsonb_build_object('trace_id', md5(g::text)),
       'sent', 1, p.at - make_interval(secs => (5 + g %% 50) / 1000.0), p.at, p.at, 'ref-' || g
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g,
     LATERAL (SELECT %(end)s::timestamptz - make_interval(secs => %(span)s * (1.0 - g::float8 / %(n)s)) AS at) AS p
"""


def _human_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def load_sent(url: str, total: int) -> dict[str, Any]:
    """Create both tables and fill the big one with ``total`` sent rows, server-side.

    generate_series in chunks of a million: no row crosses the wire, each
    statement commits on its own (WAL and checkpoints stay bounded), and the log
    shows progress during a load that takes minutes at ten million.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        for table_name in (FULL, EMPTY):
            conn.execute("SELECT outbox_create_table(%s)", (table_name,))
        end = conn.execute("SELECT now()").fetchone()
        assert end is not None
        statement = sql.SQL(_INSERT_SENT).format(sql.Identifier(FULL))
        t0 = time.monotonic()
        for lo in range(1, total + 1, CHUNK):
            hi = min(lo + CHUNK - 1, total)
            c0 = time.monotonic()
            conn.execute(statement, {"lo": lo, "hi": hi, "n": total, "end": end[0], "span": SPAN_S})
            chunk_s = time.monotonic() - c0
            log(f"  cleaner: inserted {hi:,}/{total:,} sent rows ({(hi - lo + 1) / chunk_s:,.0f} rows/s this chunk)")
        insert_s = time.monotonic() - t0
        v0 = time.monotonic()
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(FULL)))
        vacuum_s = time.monotonic() - v0
        sizes = conn.execute(
            "SELECT pg_total_relation_size(%s), pg_relation_size(%s), pg_indexes_size(%s)", (FULL, FULL, FULL)
        ).fetchone()
        assert sizes is not None
    total_b, heap_b, index_b = (int(v) for v in sizes)
    log(
        f"  cleaner: {total:,} sent rows in {insert_s:.0f} s ({total / insert_s:,.0f} rows/s), VACUUM ANALYZE "
        f"{vacuum_s:.0f} s; {FULL} is {_human_bytes(total_b)} (heap {_human_bytes(heap_b)}, "
        f"indexes {_human_bytes(index_b)})"
    )
    return {
        "rows": total,
        "insert_s": round(insert_s, 1),
        "vacuum_analyze_s": round(vacuum_s, 1),
        "load_s": round(insert_s + vacuum_s, 1),
        "total_bytes": total_b,
        "heap_bytes": heap_b,
        "index_bytes": index_b,
    }


def backlog(url: str) -> int:
    """Sent rows older than the retention: what the cleaner still owes (an index-only count)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE status = 'sent' AND published_at < now() - make_interval(secs => %s)"
            ).format(sql.Identifier(FULL)),
            (RETENTION_S,),
        ).fetchone()
    assert row is not None
    return int(row[0])


# -- claim time ------------------------------------------------------------------


def load_pending(url: str, table_name: str, count: int, prefix: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, table_name, iter_rows(count, "order.created", prefix))


def claim_run(url: str, run_index: int) -> tuple[float, float]:
    """Median claim time (ms) of 1,000 rows on the empty twin and on the full table, alternating.

    The same pending rows in both, loaded and settled (VACUUM ANALYZE, CHECKPOINT)
    before the clock; each claimed batch is settled outside it, as flat.py does.
    """
    from outbox_pipelines.core.storage.db import connect
    from outbox_pipelines.core.storage.table import OutboxTable, Settlement

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(EMPTY)))
        conn.execute(sql.SQL("DELETE FROM {} WHERE status <> 'sent'").format(sql.Identifier(FULL)))
    for table_name in (EMPTY, FULL):
        load_pending(url, table_name, CLAIMS * CLAIM_BATCH, f"claim-r{run_index}")
    settle_server(url, EMPTY, FULL)
    times: dict[str, list[float]] = {EMPTY: [], FULL: []}
    with connect(url) as conn:
        for n in range(CLAIMS):
            for table_name in (EMPTY, FULL) if n % 2 == 0 else (FULL, EMPTY):
                outbox_table = OutboxTable(conn, table_name)
                t0 = time.perf_counter()
                batch = outbox_table.claim(WORKER, CLAIM_BATCH, 60.0)
                times[table_name].append((time.perf_counter() - t0) * 1000.0)
                if len(batch) != CLAIM_BATCH:
                    raise RuntimeError(f"claim on {table_name} returned {len(batch)} rows, expected {CLAIM_BATCH}")
                outbox_table.settle(
                    WORKER, [Settlement(m.id, m.attempts, "sent", "outbox_flush_success") for m in batch]
                )
    return percentile(times[EMPTY], 50), percentile(times[FULL], 50)


# -- the cleaner -------------------------------------------------------------------


def cleaner_worker(
    url: str, seconds: float, max_rows: int, stop: multiprocessing.synchronize.Event | None, barrier: Barrier
) -> dict[str, Any]:
    """``maintenance.clean``'s loop, bounded: the same statement, batch and retention, timed per batch.

    It stops when a batch comes back short (the backlog is gone, as clean()
    stops), after ``seconds``, after ``max_rows`` (so a later pass still finds
    rows to delete), or when ``stop`` is set (the relay it runs beside is done).
    """
    from outbox_pipelines.core.storage.db import connect
    from outbox_pipelines.core.storage.table import OutboxTable

    with connect(url) as conn:
        outbox_table = OutboxTable(conn, FULL)
        barrier()
        started = time.monotonic()
        deadline = started + seconds
        batch_ms: list[float] = []
        deleted = 0
        why = "time"
        while True:
            t0 = time.perf_counter()
            n = outbox_table.clean_sent(WORKER, retention_s=RETENTION_S, limit=CLEAN_BATCH)
            batch_ms.append((time.perf_counter() - t0) * 1000.0)
            deleted += n
            if n < CLEAN_BATCH:
                why = "backlog cleared"
                break
            if deleted >= max_rows:
                why = "row cap"
                break
            if stop is not None and stop.is_set():
                why = "relay done"
                break
            if time.monotonic() >= deadline:
                break
        finished = time.monotonic()
    return {
        "kind": "cleaner",
        "started": started,
        "finished": finished,
        "deleted": deleted,
        "batches": len(batch_ms),
        "batch_ms": batch_ms,
        "stopped_by": why,
    }


def relay_worker(url: str, done: multiprocessing.synchronize.Event, barrier: Barrier) -> dict[str, Any]:
    """drain.py's relay (TableSettings defaults but competing mode) on the big table; tells the cleaner when done."""
    try:
        started, finished, sent = drain.ours_worker(url, FULL, {}, 0, barrier)
    finally:
        done.set()
    return {"kind": "relay", "started": started, "finished": finished, "sent": sent}


def _cleaner_stats(out: dict[str, Any]) -> dict[str, Any]:
    seconds = out["finished"] - out["started"]
    return {
        "deleted": out["deleted"],
        "seconds": round(seconds, 2),
        "rows_per_s": out["deleted"] / seconds,
        "batches": out["batches"],
        "batch_ms_p50": percentile(out["batch_ms"], 50),
        "batch_ms_p95": percentile(out["batch_ms"], 95),
        "batch_ms_max": max(out["batch_ms"]),
        "stopped_by": out["stopped_by"],
    }


def cleaner_alone(url: str, sizes: Sizes) -> dict[str, Any]:
    """The cleaner with nothing else running, on a third of the backlog at most.

    Two thirds stay for the pass under load, which must still be deleting when
    the relay beside it finishes: a cleaner much faster than the arrival rate
    would otherwise run out of day-old rows within seconds.
    """
    settle_server(url, FULL)
    due = backlog(url)
    log(f"  cleaner alone: {due:,} sent rows older than 1 day; deleting for up to {sizes.cleaner_seconds:.0f} s")
    out = run_processes(
        [(cleaner_worker, (url, sizes.cleaner_seconds, due // 3, None))], timeout_s=sizes.cleaner_seconds + 600
    )[0]
    stats = {"backlog_before": due, **_cleaner_stats(out)}
    log(
        f"  cleaner alone: {stats['deleted']:,} rows in {stats['seconds']:.1f} s = {stats['rows_per_s']:,.0f} rows/s; "
        f"batch of {CLEAN_BATCH:,} p50 {stats['batch_ms_p50']:.0f} ms, p95 {stats['batch_ms_p95']:.0f} ms "
        f"(stopped by {stats['stopped_by']})"
    )
    return stats


def cleaner_under_load(url: str, sizes: Sizes) -> dict[str, Any]:
    """The cleaner and a relay at once, on the same table, released together; stopped when the relay is done."""
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, FULL, make_rows(sizes.cleaner_load_messages, "order.created", "load"))
    settle_server(url, FULL)
    due = backlog(url)
    log(
        f"  cleaner under load: {due:,} sent rows older than 1 day, {sizes.cleaner_load_messages:,} pending; "
        "cleaner and relay released together"
    )
    done = SPAWN.Event()
    results = run_processes([(relay_worker, (url, done)), (cleaner_worker, (url, 3600.0, due, done))], timeout_s=3600)
    relay = next(r for r in results if r["kind"] == "relay")
    cleaner = next(r for r in results if r["kind"] == "cleaner")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE status IN ('pending', 'sending')").format(sql.Identifier(FULL))
        ).fetchone()
    left = int(row[0]) if row else -1
    if relay["sent"] != sizes.cleaner_load_messages or left != 0:
        raise RuntimeError(
            f"cleaner under load: relay sent {relay['sent']:,} of {sizes.cleaner_load_messages:,}, "
            f"{left} rows still pending or sending"
        )
    relay_s = relay["finished"] - relay["started"]
    overlap = min(relay["finished"], cleaner["finished"]) - max(relay["started"], cleaner["started"])
    stats = {
        "backlog_before": due,
        **_cleaner_stats(cleaner),
        "relay_sent": relay["sent"],
        "relay_seconds": round(relay_s, 2),
        "relay_msgs_per_s": relay["sent"] / relay_s,
        "overlap_s": round(overlap, 2),
    }
    log(
        f"  cleaner under load: cleaner {stats['deleted']:,} rows in {stats['seconds']:.1f} s = "
        f"{stats['rows_per_s']:,.0f} rows/s (batch p50 {stats['batch_ms_p50']:.0f} ms, p95 "
        f"{stats['batch_ms_p95']:.0f} ms, stopped by {stats['stopped_by']}); relay {relay['sent']:,} msgs in "
        f"{relay_s:.1f} s = {stats['relay_msgs_per_s']:,.0f} msg/s; overlap {overlap:.1f} s"
    )
    return stats


def drop_tables(url: str) -> None:
    """Drop both tables and their audit rows: the next scenario must not pay for ten million rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(sql.Identifier(FULL), sql.Identifier(EMPTY)))
        conn.execute("DELETE FROM outbox_audit WHERE outbox_table = ANY(%s)", ([FULL, EMPTY],))


# -- the scenario ------------------------------------------------------------------


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    n = sizes.cleaner_sent_rows
    try:
        result.details["load"] = load_sent(url, n)

        empty: list[float] = []
        full: list[float] = []
        for run_index in range(runs):
            e, f = claim_run(url, run_index)
            empty.append(e)
            full.append(f)
            log(
                f"  cleaner run {run_index + 1}/{runs} claim of {CLAIM_BATCH:,}: empty table {e:.2f} ms, "
                f"with {n:,} sent rows {f:.2f} ms"
            )
        result.figures.append(
            Figure(
                "cleaner",
                f"claim time, batch {CLAIM_BATCH:,}, with {n:,} sent rows kept",
                "ms",
                full,
                empty,
                "same claim on an empty table",
                Target("within ±25 % of the empty table", ratio_min=0.75, ratio_max=1.25),
                note=f"median of {CLAIMS} claims per run, alternating tables",
            )
        )
        result.details["claim_ms"] = {"full": full, "empty": empty}

        alone = cleaner_alone(url, sizes)
        result.details["alone"] = alone
        target = Target(f"≥ {ARRIVAL_RATE:,.0f} rows/s (the arrival rate)", value_min=ARRIVAL_RATE)
        result.figures.append(
            Figure(
                "cleaner",
                f"cleaner DELETE rate, {n:,} sent rows, alone (batch {CLEAN_BATCH:,}, 1-day retention)",
                "rows/s",
                [alone["rows_per_s"]],
                target=target,
                note=f"once per invocation; batch p50 {alone['batch_ms_p50']:.0f} ms, "
                f"p95 {alone['batch_ms_p95']:.0f} ms",
            )
        )

        loaded = cleaner_under_load(url, sizes)
        result.details["under_load"] = loaded
        result.figures.append(
            Figure(
                "cleaner",
                f"cleaner DELETE rate, {n:,} sent rows, while a relay drains (batch {CLEAN_BATCH:,})",
                "rows/s",
                [loaded["rows_per_s"]],
                target=target,
                note=f"once per invocation; batch p50 {loaded['batch_ms_p50']:.0f} ms, "
                f"p95 {loaded['batch_ms_p95']:.0f} ms",
            )
        )
        result.figures.append(
            Figure(
                "cleaner",
                f"relay drain beside the cleaner, {sizes.cleaner_load_messages:,} msgs "
                "(1 process, default settings, competing)",
                "msg/s",
                [loaded["relay_msgs_per_s"]],
                note="for information",
            )
        )

        slow = {
            k: s["rows_per_s"] for k, s in (("alone", alone), ("under load", loaded)) if s["rows_per_s"] < ARRIVAL_RATE
        }
        if slow:
            verdict = "DELETE-based cleaning does NOT keep up at 5,000 msg/s: " + ", ".join(
                f"{k} {v:,.0f} rows/s" for k, v in slow.items()
            )
        else:
            verdict = "DELETE-based cleaning keeps up"
        result.details["verdict"] = verdict
        log(
            f"  cleaner verdict: {verdict} (alone {alone['rows_per_s']:,.0f} rows/s, under load "
            f"{loaded['rows_per_s']:,.0f} rows/s beside a relay at {loaded['relay_msgs_per_s']:,.0f} msg/s)"
        )
    finally:
        drop_tables(url)
    return result
