"""flat: relay memory over a long drain, and claim time with many sent rows kept.

Memory: one relay process drains ``flat_messages`` pending messages (batch
1,000, no-op destination, success policy "delete" so the table does not grow)
in a single ``run(once=True)``; a progress callback called after every batch
reads VmRSS each time another tenth of the messages has been claimed. The first
tenth is warm-up; every later sample must stay within ±10 % of the RSS at the
end of warm-up. There is no ceiling: the reference is the relay itself.

Claim time: the same pending rows in two tables, one empty besides them and one
that also keeps ``flat_sent_rows`` sent rows (inserted with generate_series,
as a table with a long retention would hold). Claims of 1,000 alternate
between the two through the core's ``OutboxTable.claim`` (each batch settled
outside the clock); the figure is the median claim time, full vs empty.
"""

import time
from typing import Any

import psycopg
from psycopg import sql

from obench.common import (
    Barrier,
    Figure,
    NoopDestination,
    ScenarioResult,
    Sizes,
    Target,
    copy_rows,
    count_by_status,
    iter_rows,
    log,
    percentile,
    reset_table,
    rss_kib,
    run_processes,
    settle_server,
)

TABLE = "outbox_orders"
EMPTY, FULL = "bench_claim_empty", "bench_claim_full"
SAMPLES = 10
MEMORY_RUNS = 1
BATCH = 1_000


def relay_with_rss(url: str, total: int, barrier: Barrier) -> dict[str, Any]:
    from outbox_pipelines.core.relay import Relay, RelayReport
    from outbox_pipelines.core.settings import TableSettings

    step = max(total // SAMPLES, 1)
    samples: list[tuple[int, int, float]] = []  # (claimed, VmRSS KiB, seconds since start)
    started = [0.0]

    def progress(report: RelayReport) -> None:
        if report.claimed >= (len(samples) + 1) * step:
            samples.append((report.claimed, rss_kib(), time.monotonic() - started[0]))

    table = TableSettings(name=TABLE, mode="competing", batch_size=BATCH, on_success="delete")
    # progress_every_s=0: the callback runs after every batch; it reads /proc only at each tenth.
    relay = Relay(url, table, NoopDestination(), worker_id="bench-flat", progress=progress, progress_every_s=0.0)
    barrier()
    before = rss_kib()
    started[0] = time.monotonic()
    report = relay.run(once=True)
    after = rss_kib()
    return {
        "samples": samples,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "sent": report.sent,
        "seconds": report.seconds,
    }


def load_pending(url: str, table_name: str, count: int, prefix: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, table_name, iter_rows(count, "order.created", prefix))


def memory_run(url: str, sizes: Sizes) -> dict[str, Any]:
    reset_table(url, TABLE)
    t0 = time.monotonic()
    load_pending(url, TABLE, sizes.flat_messages, "flat")
    settle_server(url, TABLE)
    log(f"  flat: {sizes.flat_messages:,} pending rows loaded in {time.monotonic() - t0:.0f} s; draining")
    out = run_processes([(relay_with_rss, (url, sizes.flat_messages))], timeout_s=3600)[0]
    counts = count_by_status(url, TABLE)
    if out["sent"] != sizes.flat_messages or counts:
        raise RuntimeError(f"flat: relay sent {out['sent']}, table still holds {counts}")
    samples = out["samples"]
    reference = samples[0][1]
    later = [rss for _, rss, _ in samples[1:]]
    worst = max(later, key=lambda rss: abs(rss - reference)) if later else reference
    # Throughput per tenth: shows whether the drain slows down as the table churns.
    segments = []
    for (c0, _, s0), (c1, _, s1) in zip([(0, 0, 0.0)] + samples[:-1], samples, strict=False):
        segments.append(round((c1 - c0) / (s1 - s0)) if s1 > s0 else None)
    return {
        "reference_kib": reference,
        "worst_kib": worst,
        "samples": samples,
        "segment_msgs_per_s": segments,
        "rss_before_kib": out["rss_before_kib"],
        "rss_after_kib": out["rss_after_kib"],
        "drain_msgs_per_s": out["sent"] / out["seconds"],
    }


def prepare_claim_tables(url: str, sizes: Sizes) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for table_name in (EMPTY, FULL):
            conn.execute("SELECT outbox_create_table(%s)", (table_name,))
        t0 = time.monotonic()
        conn.execute(
            sql.SQL(
                """
                INSERT INTO {} (event_id, topic, payload, payload_sha, headers, status, attempts,
                                created_at, updated_at, published_at, result_ref)
                SELECT 'sent-' || g, 'order.created',
                       jsonb_build_object('order_id', 'ord-' || g, 'amount_cents', 1000 + g %% 50000,
                                          'currency', 'EUR', 'note', 'benchmark message'),
                       'sha256:' || encode(sha256(g::text::bytea), 'hex'),
                       jsonb_build_object('trace_id', md5(g::text)),
                       'sent', 1, now() - interval '2 hours', now() - interval '1 hour',
                       now() - interval '1 hour', 'ref-' || g
                FROM generate_series(1, %s) AS g
                """
            ).format(sql.Identifier(FULL)),
            (sizes.flat_sent_rows,),
        )
    log(f"  flat: {sizes.flat_sent_rows:,} sent rows inserted in {time.monotonic() - t0:.0f} s")


def claim_run(url: str, sizes: Sizes, run_index: int) -> tuple[float, float]:
    """Median claim time (ms) on the empty table and on the full one."""
    from outbox_pipelines.core.storage.db import connect
    from outbox_pipelines.core.storage.table import OutboxTable, Settlement

    pending = sizes.flat_claims * BATCH
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(EMPTY)))
        conn.execute(sql.SQL("DELETE FROM {} WHERE status <> 'sent'").format(sql.Identifier(FULL)))
    for table_name in (EMPTY, FULL):
        load_pending(url, table_name, pending, f"claim-r{run_index}")
    settle_server(url, EMPTY, FULL)
    times: dict[str, list[float]] = {EMPTY: [], FULL: []}
    # The relay's own kind of connection (dict rows), and the core's own claim.
    with connect(url) as conn:
        for n in range(sizes.flat_claims):
            order = (EMPTY, FULL) if n % 2 == 0 else (FULL, EMPTY)
            for table_name in order:
                outbox_table = OutboxTable(conn, table_name)
                t0 = time.perf_counter()
                batch = outbox_table.claim("bench-claim", BATCH, 60.0)
                times[table_name].append((time.perf_counter() - t0) * 1000.0)
                if len(batch) != BATCH:
                    raise RuntimeError(f"claim on {table_name} returned {len(batch)} rows, expected {BATCH}")
                outbox_table.settle(
                    "bench-claim", [Settlement(m.id, m.attempts, "sent", "outbox_flush_success") for m in batch]
                )
    return percentile(times[EMPTY], 50), percentile(times[FULL], 50)


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    memory: list[dict[str, Any]] = []
    # The memory drain is one long trajectory whose ten samples are its own
    # spread; repeating it --runs times would cost minutes per run (a million
    # messages at a few thousand msg/s), so it runs once. Claim timing repeats.
    for run_index in range(MEMORY_RUNS):
        m = memory_run(url, sizes)
        memory.append(m)
        log(
            f"  flat memory run {run_index + 1}/{MEMORY_RUNS}: RSS after warm-up {m['reference_kib'] / 1024:.1f} MiB, "
            f"worst later {m['worst_kib'] / 1024:.1f} MiB ({(m['worst_kib'] / m['reference_kib'] - 1) * 100:+.1f} %), "
            f"drain {m['drain_msgs_per_s']:,.0f} msg/s"
        )
    result.figures.append(
        Figure(
            "flat",
            f"flat relay RSS over {sizes.flat_messages:,} msgs (worst sample after the first tenth)",
            "MiB",
            [m["worst_kib"] / 1024 for m in memory],
            [m["reference_kib"] / 1024 for m in memory],
            "RSS at the end of warm-up (first tenth)",
            Target("within ±10 % of warm-up", ratio_min=0.9, ratio_max=1.1),
            note="one drain per invocation; its ten RSS samples are in results.json",
        )
    )
    result.figures.append(
        Figure(
            "flat",
            f"flat drain throughput over {sizes.flat_messages:,} msgs (batch {BATCH:,}, delete on success)",
            "msg/s",
            [m["drain_msgs_per_s"] for m in memory],
            note="for information",
        )
    )
    prepare_claim_tables(url, sizes)
    empty: list[float] = []
    full: list[float] = []
    for run_index in range(runs):
        e, f = claim_run(url, sizes, run_index)
        empty.append(e)
        full.append(f)
        log(f"  flat run {run_index + 1}/{runs} claim of {BATCH:,}: empty table {e:.1f} ms, with sent rows {f:.1f} ms")
    result.figures.append(
        Figure(
            "flat",
            f"flat claim time, batch {BATCH:,}, with {sizes.flat_sent_rows:,} sent rows kept",
            "ms",
            full,
            empty,
            "same claim on a table without sent rows",
            Target("within ±25 % of the empty table", ratio_min=0.75, ratio_max=1.25),
        )
    )
    result.details["memory_runs"] = memory
    return result
