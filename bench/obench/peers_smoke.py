"""Smoke check of obench.peers at small sizes: every peer runs, counts come out right, rates print.

    cd bench && ../.venv/bin/python -m obench.peers_smoke

A script, not a pytest test (it starts the bench's own PostgreSQL, as
bench/run.py does, and stops it on the way out). Sizes are small on purpose:
it checks that the peers work, not how fast they are.
"""

import time
import uuid

import psycopg

from obench import peers
from obench.common import (
    BenchServer,
    copy_rows,
    count_by_status,
    log,
    make_rows,
    reset_table,
    run_processes,
    sample_payload,
    settle_server,
    stop_all_processes,
)

TABLE = "outbox_orders"
MESSAGES = 2_000
WORKERS = 2
BATCH = 500
ENQUEUE_BATCH = 1_000
LATENCY_RATE, LATENCY_SECONDS = 200.0, 2.0


def check_simple_loop(url: str) -> float:
    """The simple loop drains MESSAGES rows with WORKERS processes; every row ends 'sent'."""
    reset_table(url, TABLE)
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, TABLE, make_rows(MESSAGES, "order.created", "peer"))
    with peers.simple_loop_index(url, TABLE):
        settle_server(url, TABLE)
        results = run_processes(
            [(peers.simple_drain_worker, (url, TABLE, BATCH, i)) for i in range(WORKERS)], timeout_s=300
        )
    sent: int = sum(r[2] for r in results)
    elapsed: float = max(r[1] for r in results) - min(r[0] for r in results)
    counts = count_by_status(url, TABLE)
    assert sent == MESSAGES, f"simple loop reported {sent} sent, expected {MESSAGES}"
    assert counts == {"sent": MESSAGES}, f"simple loop left {counts}"
    return sent / elapsed


def check_pgqueuer_drain(url: str) -> float:
    """pgqueuer (defaults) drains MESSAGES jobs with WORKERS processes; queue empty, log says all done."""
    rate = peers.pgqueuer_drain_once(url, WORKERS, MESSAGES)  # raises on a wrong count
    counts = peers.pgqueuer_counts(url)
    assert counts["queue_total"] == 0, counts
    assert counts["log"].get("successful") == MESSAGES, counts
    return rate


def _items(count: int, tag: str) -> list[peers.EnqueueItem]:
    run = uuid.uuid4().hex[:8]
    return [
        (f"{tag}-{run}-{n}", "order.created", sample_payload(n), {"trace_id": uuid.uuid4().hex}) for n in range(count)
    ]


def check_batch_enqueue(url: str) -> dict[str, float]:
    """One batch of ENQUEUE_BATCH through each reference, committed; msg/s of the timed call + commit."""
    rates: dict[str, float] = {}
    for name, func in (("executemany", peers.executemany_insert), ("copy", peers.bare_copy)):
        reset_table(url, TABLE)
        items = _items(ENQUEUE_BATCH, name)
        with psycopg.connect(url) as conn:
            t0 = time.monotonic()
            written = func(conn, TABLE, items)
            conn.commit()
            rates[name] = written / (time.monotonic() - t0)
        assert written == ENQUEUE_BATCH
        assert count_by_status(url, TABLE) == {"pending": ENQUEUE_BATCH}, name
    peers.pgqueuer_reset(url)
    payloads = [sample_payload(n) for n in range(ENQUEUE_BATCH)]
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.monotonic()
        ids = peers.pgqueuer_enqueue_batch(conn, payloads)
        rates["pgqueuer"] = len(ids) / (time.monotonic() - t0)
    counts = peers.pgqueuer_counts(url)
    assert len(ids) == ENQUEUE_BATCH and counts["queue"] == {"queued": ENQUEUE_BATCH}, counts
    peers.pgqueuer_reset(url)
    return rates


def main() -> None:
    server = BenchServer()
    name = None
    try:
        name, url = server.create_database("peers")
        installed = peers.pgqueuer_install(url)
        assert not peers.pgqueuer_install(url), "a second install must be a no-op"
        log(f"pgqueuer schema installed: {installed}")

        rate = check_simple_loop(url)
        log(f"simple loop drain x{WORKERS} (batch {BATCH}, {MESSAGES:,} msgs): {rate:9,.0f} msg/s  [all sent]")

        rate = check_pgqueuer_drain(url)
        log(
            f"pgqueuer drain x{WORKERS} (defaults, {MESSAGES:,} jobs):    {rate:9,.0f} msg/s  "
            "[queue empty, log successful = loaded]"
        )

        for kind, rate in check_batch_enqueue(url).items():
            log(f"batch enqueue {ENQUEUE_BATCH:,} ({kind:11s}):                {rate:9,.0f} msg/s")

        m = peers.pgqueuer_latency_measure(url, LATENCY_RATE, LATENCY_SECONDS)
        log(
            f"pgqueuer latency at {LATENCY_RATE:.0f}/s for {LATENCY_SECONDS:.0f} s: p50 {m['p50']:.2f} ms  "
            f"p95 {m['p95']:.2f} ms  p99 {m['p99']:.2f} ms  max {m['max']:.2f} ms  ({m['messages']} msgs, "
            f"{m['missing']} missing, producer at {m['achieved_rate']:.0f}/s)"
        )
        assert m["missing"] == 0, m
        log("peers smoke: OK")
    finally:
        stop_all_processes()
        if name is not None:
            server.drop_database(name)
        server.close()


if __name__ == "__main__":
    main()
