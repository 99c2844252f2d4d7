"""group: what hosting a busy table in a relay group costs it, against the same table's dedicated relay.

Issue 23's question: a relay group runs every table of a group in one process (core/relay/group.py); does a
busy table pay for sharing it with 49 quiet ones? Same run, rounds interleaved, each a fresh start:

- latency: commit → handler at a steady rate (latency.py's producer), the busy table relayed by a
  dedicated ``Relay`` and by a ``GroupRelay`` hosting it beside 49 quiet tables (each with its own handlers);
- throughput: 50,000 messages committed at once into the busy table, drained (batch 100, the default) the
  same two ways, msg/s from its first message handled to its last.

The group is started, and its quiet tables looked at and quiet again, before the clock starts: a group
run lives 31 minutes, its start-up is not what its tables' messages wait for.

The ratio is group / dedicated: for latency, lower is better; for throughput, higher is better.
"""

import threading
import time
from typing import Any

import psycopg

from obench.common import (
    DEADLINE_FACTOR,
    DEADLINE_SLACK_S,
    PRODUCER_HEAD_START_S,
    Barrier,
    Figure,
    ScenarioResult,
    Sizes,
    Target,
    latency_summary,
    log,
    reset_table,
    run_processes,
    sample_payload,
    settle_server,
)
from obench.latency import producer

TABLE = "outbox_events"
TOPIC = "bench.latency"
QUIET = [f"quiet{n:02d}_outbox" for n in range(49)]
DRAIN = 50_000


def _settings(url: str) -> Any:
    from outbox_pipelines.core.settings import Settings, TableSettings, load_settings

    base = load_settings(env={}, path=None)
    tables = {
        name: TableSettings(name=name, destination="handlers", handlers="x:y", mode="single-active")
        for name in (TABLE, *QUIET)
    }
    return Settings(base.env, tables, None)


def _consume(
    url: str, expected: int, seconds: float, barrier: Barrier, grouped: bool, fill: int = 0
) -> tuple[str, dict[str, float], dict[str, Any]]:
    """Relay the busy table (alone, or in a group of 50) until ``expected`` messages reached its handler;
    ``fill``: enqueue that many first, once the relay (or the group) is up, in one transaction."""
    from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.relay.group import GroupRelay
    from outbox_pipelines.core.relay.table_relay import freeze_startup_objects

    delivered: dict[str, float] = {}
    stoppers: list[Any] = []

    def handler(message: Any) -> None:
        delivered[message.event_id] = time.monotonic()
        if len(delivered) >= expected:
            for stopper in stoppers:
                stopper.request_stop()

    def build(table: Any, settings: Any) -> HandlerDestination:
        registry = HandlerRegistry()
        registry.register(TOPIC, handler if table.name == TABLE else (lambda message: None))
        return HandlerDestination(registry)

    settings = _settings(url)
    if grouped:
        # A group run as it is most of its life: started, its quiet tables looked at once and quiet again.
        group = GroupRelay(url, settings, [TABLE, *QUIET], worker_prefix="bench-group", destinations=build)
        stoppers.append(group)
        runner = threading.Thread(target=group.run, kwargs={"max_seconds": seconds + 30})
        runner.start()
        deadline = time.monotonic() + 60
        while (
            not (
                all(w.activations for w in group.workers.values()) and not any(w.active for w in group.workers.values())
            )
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
    else:
        relay = Relay(url, settings.tables[TABLE], build(settings.tables[TABLE], settings), worker_id="bench-dedicated")
        stoppers.append(relay)
        freeze_startup_objects()  # as run_table_relay does (the group freezes its own once built)
        runner = threading.Thread(target=relay.run, kwargs={"max_seconds": seconds})
        runner.start()
        time.sleep(0.5)  # connected and listening
    barrier()
    if fill:
        _fill(url, fill)
    runner.join()
    times = sorted(delivered.values())
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    return "consumer", delivered, {"sent": len(delivered), "rate": rate}


def latency_consumer(
    url: str, expected: int, seconds: float, grouped: bool, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    return _consume(url, expected, seconds, barrier, grouped)


def drain_consumer(
    url: str, expected: int, seconds: float, grouped: bool, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    return _consume(url, expected, seconds, barrier, grouped, fill=expected)


def _prepare(url: str) -> None:
    from outbox_pipelines.core.storage.schema import create_table

    for name in QUIET:
        create_table(url, name)


def _fill(url: str, n: int) -> None:
    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message

    with psycopg.connect(url) as conn:
        for start in range(0, n, 5_000):
            Outbox(TABLE).enqueue_many(
                conn,
                [
                    Message(topic=TOPIC, payload=sample_payload(i), event_id=f"d-{i}")
                    for i in range(start, min(n, start + 5_000))
                ],
            )
        conn.commit()


def measure_latency(url: str, sizes: Sizes, grouped: bool) -> dict[str, Any]:
    reset_table(url, TABLE)
    settle_server(url, TABLE)
    expected = int(sizes.latency_rate * sizes.latency_seconds)
    deadline_s = PRODUCER_HEAD_START_S + sizes.latency_seconds * DEADLINE_FACTOR + DEADLINE_SLACK_S
    results = run_processes(
        [
            (latency_consumer, (url, expected, deadline_s, grouped)),
            (producer, (url, sizes.latency_rate, sizes.latency_seconds)),
        ],
        timeout_s=deadline_s + 60,
    )
    committed = next(r[1] for r in results if r[0] == "producer")
    delivered = next(r[1] for r in results if r[0] == "consumer")
    return latency_summary(committed, delivered, sizes.latency_rate)


def measure_drain(url: str, n: int, grouped: bool) -> float:
    """msg/s from the first message handled to the last (a group's start-up is not the busy table's drain)."""
    reset_table(url, TABLE)
    settle_server(url, TABLE)
    [(_, delivered, info)] = run_processes([(drain_consumer, (url, n, 600.0, grouped))], timeout_s=660)
    if len(delivered) != n:
        raise RuntimeError(f"group drain ({'group' if grouped else 'dedicated'}): {len(delivered)} of {n} handled")
    return float(info["rate"])


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    _prepare(url)
    drain_n = DRAIN if sizes.drain_messages >= 50_000 else 10_000
    lat: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    rates: dict[bool, list[float]] = {False: [], True: []}
    for run_index in range(runs):
        order = (False, True) if run_index % 2 == 0 else (True, False)
        for grouped in order:
            m = measure_latency(url, sizes, grouped)
            lat[grouped].append(m)
            rate = measure_drain(url, drain_n, grouped)
            rates[grouped].append(rate)
            log(
                f"  group run {run_index + 1}/{runs} {'group of 50' if grouped else 'dedicated  '}: latency p50 "
                f"{m['p50']:.2f} ms p99 {m['p99']:.2f} ms; drain {rate:,.0f} msg/s"
            )
    dedicated = "the same table's dedicated Relay, same run"
    for quantile in ("p50", "p99", "p99.9"):
        result.figures.append(
            Figure(
                "group",
                f"commit→handler at {sizes.latency_rate:.0f} msg/s, the busy table in a group of 50: {quantile}",
                "ms",
                [m[quantile] for m in lat[True]],
                [m[quantile] for m in lat[False]],
                dedicated,
                Target("≤ 1.25× dedicated", ratio_max=1.25) if quantile == "p99" else None,
                note="" if quantile == "p99" else "for information",
            )
        )
    result.figures.append(
        Figure(
            "group",
            f"drain {drain_n:,} of the busy table (batch 100), in a group of 50",
            "msg/s",
            rates[True],
            rates[False],
            dedicated,
            Target("≥ 0.9× dedicated", ratio_min=0.9),
        )
    )
    result.details["runs"] = {
        "latency": {"dedicated": lat[False], "group": lat[True]},
        "drain_msg_s": {"dedicated": rates[False], "group": rates[True]},
    }
    return result
