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

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from obench import peers
from obench.common import (
    DEADLINE_FACTOR,
    DEADLINE_SLACK_S,
    PRODUCER_HEAD_START_S,
    Barrier,
    Figure,
    ScenarioResult,
    Sizes,
    Target,
    count_by_status,
    latency_summary,
    log,
    reset_table,
    run_processes,
    sample_payload,
    settle_server,
)

TABLE = "outbox_events"
TOPIC = "bench.latency"


def producer(url: str, rate: float, seconds: float, barrier: Barrier) -> tuple[str, dict[str, float]]:
    return keyed_producer(url, rate, seconds, 0, barrier)


def keyed_producer(url: str, rate: float, seconds: float, keys: int, barrier: Barrier) -> tuple[str, dict[str, float]]:
    """One enqueue per transaction at ``rate``; with ``keys``, message n has ordering key agg-(n % keys)."""
    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message

    outbox = Outbox(TABLE)
    count = int(rate * seconds)
    messages = [
        Message(
            topic=TOPIC,
            payload=sample_payload(n),
            event_id=f"lat-{n}",
            ordering_key=f"agg-{n % keys}" if keys else None,
        )
        for n in range(count)
    ]
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


def simple_consumer(
    url: str, expected: int, seconds: float, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    """The simple loop a person would write, woken by LISTEN: on each NOTIFY, claim (FOR UPDATE SKIP
    LOCKED), handle, mark sent, commit, until a claim comes back empty. Batch 100, as ours."""
    delivered: dict[str, float] = {}
    claim = sql.SQL(peers.SIMPLE_CLAIM).format(sql.Identifier(TABLE))
    settle = sql.SQL(peers.SIMPLE_SETTLE).format(sql.Identifier(TABLE))
    batches = 0
    barrier()
    deadline = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url) as conn:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"outbox:{TABLE}")))
        while len(delivered) < expected and time.monotonic() < deadline:
            while True:
                rows = conn.execute(claim, (100,)).fetchall()
                if not rows:
                    conn.commit()
                    break
                now = time.monotonic()
                for row in rows:
                    delivered[row[1]] = now
                conn.execute(settle, ([row[0] for row in rows],))
                conn.commit()
                batches += 1
            for _ in listener.notifies(timeout=max(min(0.25, deadline - time.monotonic()), 0.0), stop_after=1):
                pass
    return "consumer", delivered, {"batches": batches, "sent": len(delivered)}


def cli_consumer(
    url: str, expected: int, seconds: float, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    """``outbox-pipelines relay --table outbox_events`` as a user runs it, its handler from
    obench.latency_handlers; released once the relay has registered (connected and LISTENing)."""
    with tempfile.TemporaryDirectory(prefix="outbox-bench-latency-") as scratch:
        config, out = Path(scratch) / "outbox.toml", Path(scratch) / "delivered.json"
        config.write_text(
            f'[tables.{TABLE}]\ndestination = "handlers"\n'
            'handlers = "obench.latency_handlers:registry"\nmode = "single-active"\n'
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")},
            "OUTBOX_DATABASE_URL": url,
            "OUTBOX_CONFIG": str(config),
            "OUTBOX_BENCH_LATENCY_OUT": str(out),
            "OUTBOX_BENCH_LATENCY_EXPECTED": str(expected),
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        }
        relay = subprocess.Popen(
            [sys.executable, "-m", "outbox_pipelines.cli", "relay", "--table", TABLE, "--quiet"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for_registration(url, relay)
            barrier()
            try:
                _, err = relay.communicate(timeout=seconds)
            except subprocess.TimeoutExpired:
                relay.terminate()
                _, err = relay.communicate(timeout=30)
            if relay.returncode != 0:
                raise RuntimeError(f"the CLI relay exited {relay.returncode}: {err[-2000:]}")
            delivered = json.loads(out.read_text(encoding="utf-8"))
        finally:
            if relay.poll() is None:
                relay.kill()
                relay.wait(10)
    return "consumer", delivered, {"sent": len(delivered)}


def _wait_for_registration(url: str, relay: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if relay.poll() is not None:
                raise RuntimeError(f"the CLI relay exited {relay.returncode} at start: {relay.stderr.read()[-2000:]}")
            row = conn.execute(
                "SELECT count(*) FROM outbox_relay_workers WHERE table_name = %s AND stopped_at IS NULL", (TABLE,)
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    raise RuntimeError("the CLI relay did not register within 60 s")


CONSUMERS = {"ours-cli": cli_consumer, "ours": ours_consumer, "simple": simple_consumer}


def measure(url: str, kind: str, sizes: Sizes) -> dict[str, Any]:
    if kind == "pgqueuer":
        return peers.pgqueuer_latency_measure(url, sizes.latency_rate, sizes.latency_seconds)
    reset_table(url, TABLE)
    settle_server(url, TABLE)
    consumer = CONSUMERS[kind]
    expected = int(sizes.latency_rate * sizes.latency_seconds)
    deadline_s = PRODUCER_HEAD_START_S + sizes.latency_seconds * DEADLINE_FACTOR + DEADLINE_SLACK_S
    jobs = [(consumer, (url, expected, deadline_s)), (producer, (url, sizes.latency_rate, sizes.latency_seconds))]
    if kind == "simple":
        with peers.simple_loop_index(url, TABLE):
            results = run_processes(jobs, timeout_s=deadline_s + 60)
    else:
        results = run_processes(jobs, timeout_s=deadline_s + 60)
    committed = next(r[1] for r in results if r[0] == "producer")
    delivered, info = next((r[1], r[2]) for r in results if r[0] == "consumer")
    return {**latency_summary(committed, delivered, sizes.latency_rate), "table": count_by_status(url, TABLE), **info}


KINDS = ("ours-cli", "ours", "simple", "pgqueuer")
REFERENCE = "simple loop woken by LISTEN (FOR UPDATE SKIP LOCKED, UPDATE, commit), batch 100"


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    stats: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    peers.pgqueuer_install(url)
    for run_index in range(runs):
        shift = run_index % len(KINDS)
        for kind in KINDS[shift:] + KINDS[:shift]:
            m = measure(url, kind, sizes)
            stats[kind].append(m)
            log(
                f"  latency run {run_index + 1}/{runs} {kind:8s} p50 {m['p50']:6.2f} ms  p95 {m['p95']:6.2f} ms  "
                f"p99 {m['p99']:6.2f} ms  p99.9 {m['p99.9']:6.2f} ms  ({m['messages']:,} msgs at "
                f"{m['achieved_rate']:.0f}/s, {m['missing']} missing)"
            )
            if m["achieved_rate"] < 0.9 * sizes.latency_rate:
                log(
                    f"  WARNING: the producer fell behind its schedule ({m['achieved_rate']:.0f}/s): "
                    "the machine is busy"
                )
            if m["missing"]:
                raise RuntimeError(f"latency {kind}: {m['missing']} committed messages never reached the handler")
    label = f"latency commit→handler at {sizes.latency_rate:.0f} msg/s, {sizes.latency_seconds:.0f} s"
    for kind, what in (
        ("ours-cli", "CLI relay (outbox-pipelines relay)"),
        ("ours", "Relay in a process of ours"),
        ("pgqueuer", "pgqueuer 1.6 at its defaults"),
    ):
        for quantile in ("p50", "p95", "p99", "p99.9"):
            target = Target("≤ 5 ms", value_max=5.0) if (kind, quantile) == ("ours-cli", "p99") else None
            result.figures.append(
                Figure(
                    "latency",
                    f"{label}, {what}: {quantile}",
                    "ms",
                    [m[quantile] for m in stats[kind]],
                    [m[quantile] for m in stats["simple"]],
                    REFERENCE,
                    target,
                    note="" if target else "for information",
                )
            )
    result.details["runs"] = stats
    return result
