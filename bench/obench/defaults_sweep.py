"""defaults: the numbers behind the shipped defaults (outbox.example.toml, "Choosing the numbers").

Three sweeps, each value measured in the same run, rounds interleaved (the order
rotates each round), medians over the runs:

- batch_size: 4 competing relay processes draining to a no-op destination, claim = lease and
  claim = transaction (the drain scenario's table and loader);
- handler threads (the ``parallelism`` key): one relay with in-process handlers that wait
  1 ms each (an I/O-bound handler: a mail API, a cache write) and handlers that do nothing
  (what a thread hand-off costs);
- requests in flight (the ``concurrency`` key): one relay posting to a local aiohttp sink that
  answers after 5 ms (a broker's latency on a LAN), batch 100.
"""

import time
from typing import Any

from obench import drain
from obench.common import (
    Barrier,
    Figure,
    ScenarioResult,
    Sizes,
    copy_rows,
    log,
    make_rows,
    reset_table,
    run_processes,
    settle_server,
)
from obench.http_bench import Sink

TABLE = "outbox_orders"
BATCHES = (50, 100, 250, 500, 1000)
THREADS = (1, 2, 4, 8, 16)
IN_FLIGHT = (8, 16, 32, 64)
HANDLER_WAIT_S = 0.001
SINK_DELAY_S = 0.005


def _interleaved(values: tuple[Any, ...], runs: int, measure: Any, what: str) -> dict[Any, list[float]]:
    rates: dict[Any, list[float]] = {value: [] for value in values}
    for run_index in range(runs):
        shift = run_index % len(values)
        for value in values[shift:] + values[:shift]:
            rates[value].append(measure(value))
            log(f"  {what} {value!s:>18s} run {run_index + 1}/{runs}: {rates[value][-1]:9,.0f} msg/s")
    return rates


# -- handler threads ---------------------------------------------------------------


def handlers_worker(url: str, threads: int, wait_s: float, barrier: Barrier) -> tuple[float, int]:
    from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    registry = HandlerRegistry()
    registry.register("order.created", (lambda _message: time.sleep(wait_s)) if wait_s else (lambda _message: None))
    table = TableSettings(name=TABLE, destination="handlers", mode="competing", handler_threads=threads)
    relay = Relay(url, table, HandlerDestination(registry, threads=threads), worker_id=f"bench-threads-{threads}")
    barrier()
    report = relay.run(once=True)
    return report.seconds, report.sent


def _one_relay_rate(url: str, rows: list[Any], worker: Any, args: tuple[Any, ...], what: str) -> float:
    """Load the rows, drain them with one relay process running ``worker(url, *args)``; msg/s (checked)."""
    _load(url, rows)
    seconds, sent = run_processes([(worker, (url, *args))], timeout_s=900)[0]
    if sent != len(rows):
        raise RuntimeError(f"{what}: {sent} sent of {len(rows)}")
    return float(sent / seconds)


# -- requests in flight --------------------------------------------------------------


def http_worker(url: str, sink_url: str, in_flight: int, barrier: Barrier) -> tuple[float, int]:
    from outbox_pipelines.core.destinations.http.destination import HttpDestination
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    destination = HttpDestination(sink_url, max_in_flight=in_flight)
    table = TableSettings(
        name=TABLE, destination="http", url=sink_url, mode="competing", requests_in_flight=in_flight, preset="orders"
    )
    relay = Relay(url, table, destination, worker_id=f"bench-inflight-{in_flight}")
    try:
        barrier()
        report = relay.run(once=True)
    finally:
        destination.close()
    return report.seconds, report.sent


def _load(url: str, rows: list[Any]) -> None:
    import psycopg

    reset_table(url, TABLE)
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, TABLE, rows)
    settle_server(url, TABLE)


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    drain_rows = make_rows(sizes.sweep_messages, "order.created", "sweep")
    for claim in ("lease", "transaction"):
        rates = _interleaved(
            BATCHES,
            runs,
            lambda b, c=claim: drain.drain_once(url, "ours", 4, drain_rows, {"batch_size": b, "claim": c}),
            f"batch_size (claim={claim})",
        )
        for batch in BATCHES:
            result.figures.append(
                Figure(
                    "defaults",
                    f"4 relays, claim={claim}, batch_size {batch}",
                    "msg/s",
                    rates[batch],
                    note="for information",
                )
            )
        result.details[f"batch_size_claim_{claim}"] = rates
    handler_rows = make_rows(sizes.sweep_messages // 8, "order.created", "threads")
    for wait_s, what in ((HANDLER_WAIT_S, "handlers waiting 1 ms"), (0.0, "no-op handlers")):
        rates = _interleaved(
            THREADS,
            runs,
            lambda t, w=wait_s: _one_relay_rate(url, handler_rows, handlers_worker, (t, w), f"parallelism {t}"),
            f"threads ({what})",
        )
        for threads in THREADS:
            result.figures.append(
                Figure(
                    "defaults",
                    f"1 relay, {what}, parallelism {threads}",
                    "msg/s",
                    rates[threads],
                    note="for information",
                )
            )
        result.details[f"threads_{what}"] = rates
    sink = Sink(delay_s=SINK_DELAY_S)
    try:
        http_rows = make_rows(sizes.sweep_messages // 8, "order.created", "inflight")
        rates = _interleaved(
            IN_FLIGHT,
            runs,
            lambda n: _one_relay_rate(url, http_rows, http_worker, (sink.url, n), f"concurrency {n}"),
            "in flight",
        )
        for in_flight in IN_FLIGHT:
            result.figures.append(
                Figure(
                    "defaults",
                    f"1 relay, HTTP sink answering in 5 ms, concurrency {in_flight}",
                    "msg/s",
                    rates[in_flight],
                    note="for information (batch 100)",
                )
            )
        result.details["in_flight"] = rates
    finally:
        sink.stop()
    return result
