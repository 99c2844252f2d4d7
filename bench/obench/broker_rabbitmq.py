"""rabbitmq: the relay's RabbitMQ destination against the same client's own publish loop, in the same run.

The broker is a RabbitMQ node of Debian's package started for this measurement
(``outbox_pipelines_tests/brokers/rabbitmq_server.py``: its own node name, ports, epmd and data dir, no
plugins), stopped by its pid at the end. Each side publishes to an exchange of its own (durable, topic)
with a durable queue bound to it, so every publish is routed and stored persistently; the queue is
checked (it holds every message) and purged after each side.

Per run, interleaved, each side in a fresh spawned process; every figure counts from the connection's
opening (the relay opens its connection at its first batch, inside its clock) to the last confirm:

- the client's own publish loop, the fastest simple loop a user writes with the destination's client
  (aiormq, the AMQP client under aio-pika) for the relay's guarantee (publisher confirms, persistent,
  mandatory): ``requests_in_flight`` (32) publishes, then await their confirms, batch after batch. This is
  the comparison (``client_loop_msg_s``);
- for information: the naive loop (publish, await its confirm, next), aio-pika's ``Exchange.publish``
  with 32 in flight, and pika's BlockingConnection in confirm mode (it waits for each confirm: it cannot
  keep publishes in flight). These are the measurements behind the destination's choice of client. And
  the destination alone: its ``deliver`` called with batches of 100 made beforehand, no database, which
  tells the destination's own cost from the relay's (claim and settle);
- the outbox loop a team writes with aiormq (``outbox_loop_msg_s``, obench.outbox_loop): FOR UPDATE SKIP
  LOCKED LIMIT 100 on the same loaded rows (the simple loop's claim and pending index), each 32 of the batch
  published and confirmed as the aiormq-32 loop does, UPDATE ... WHERE id = ANY, COMMIT; from its first
  claim to its last commit (channel and PostgreSQL opened before), the queue checked as for the others;
- the relay draining ``messages`` rows loaded beforehand (``copy_rows``; not measured), batch 100, into
  its RabbitMQDestination with 32 in flight: msg/s = sent / the relay's seconds (claim, deliver, settle).
"""

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the obench package and the repository on the path
    for entry in (str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])):
        if entry not in sys.path:
            sys.path.insert(0, entry)

import psycopg

from obench.common import (
    Barrier,
    copy_rows,
    count_by_status,
    log,
    make_rows,
    reset_table,
    run_processes,
    sample_payload,
    settle_server,
)

TABLE = "outbox_events"
BATCH = 100
INFLIGHT = 32
TOPIC = "order.created"
# The client loops, each in its own process; "aiormq-32" is the comparison.
LOOPS = ("aiormq-32", "aiormq-sequential", "aio-pika-32", "pika-blocking", "destination-alone")
# The outbox loop a team writes with the same client (obench.outbox_loop): the second reference.
OUTBOX = "outbox-loop"
OPTIONAL = {"aio-pika-32": "aio_pika", "pika-blocking": "pika"}


def _parts(messages: int) -> list[tuple[str, dict[str, Any]]]:
    """(event_id, payload) of every message, made before the clock starts; each loop serialises the payload
    as it publishes, as a user's loop (and the relay) does."""
    return [(f"rabbitmq-{n}", sample_payload(n)) for n in range(messages)]


def _body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


async def _aiormq_channel(url: str, exchange: str) -> tuple[Any, Any]:
    """(connection, channel) of the aiormq loops: publisher confirms, returns raise, the exchange declared."""
    import aiormq

    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    await channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    return connection, channel


async def _aiormq_publish(
    channel: Any, exchange: str, routing_key: str, parts: list[tuple[str, dict[str, Any]]]
) -> int:
    """Publish each part at once (persistent, mandatory), then await their confirms: how many were acked."""
    from pamqp import commands as spec

    async def publish(event_id: str, payload: dict[str, Any]) -> Any:
        properties = spec.Basic.Properties(
            content_type="application/json", delivery_mode=2, message_id=event_id, headers={"Idempotency-Key": event_id}
        )
        return await channel.basic_publish(
            _body(payload), exchange=exchange, routing_key=routing_key, properties=properties, mandatory=True
        )

    answers = await asyncio.gather(*(publish(e, b) for e, b in parts))
    return sum(isinstance(a, spec.Basic.Ack) for a in answers)


async def _aiormq_loop(url: str, exchange: str, parts: list[tuple[str, dict[str, Any]]], inflight: int) -> int:
    connection, channel = await _aiormq_channel(url, exchange)
    confirmed = 0
    for start in range(0, len(parts), inflight):
        confirmed += await _aiormq_publish(channel, exchange, TOPIC, parts[start : start + inflight])
    await connection.close()
    return confirmed


async def _aio_pika_loop(url: str, exchange_name: str, parts: list[tuple[str, dict[str, Any]]], inflight: int) -> int:
    import aio_pika

    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC, durable=True)

    def message(event_id: str, payload: dict[str, Any]) -> aio_pika.Message:
        return aio_pika.Message(
            _body(payload),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=event_id,
            headers={"Idempotency-Key": event_id},
        )

    confirmed = 0
    for start in range(0, len(parts), inflight):
        await asyncio.gather(
            *(exchange.publish(message(e, b), TOPIC, mandatory=True) for e, b in parts[start : start + inflight])
        )
        confirmed += len(parts[start : start + inflight])  # publish raises unless the broker acked
    await connection.close()
    return confirmed


def _pika_loop(url: str, exchange: str, parts: list[tuple[str, dict[str, Any]]]) -> int:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare(exchange, "topic", durable=True)
    for event_id, payload in parts:  # basic_publish returns once the broker confirmed (raises otherwise)
        channel.basic_publish(
            exchange,
            TOPIC,
            _body(payload),
            pika.BasicProperties(
                content_type="application/json",
                delivery_mode=2,
                message_id=event_id,
                headers={"Idempotency-Key": event_id},
            ),
            mandatory=True,
        )
    connection.close()
    return len(parts)


def client_loop(kind: str, url: str, exchange: str, messages: int, barrier: Barrier) -> dict[str, Any]:
    """One publish loop (in a spawned process): msg/s from the connection's opening to the last confirm."""
    parts = _parts(messages)
    barrier()
    started = time.perf_counter()
    if kind == "aiormq-32":
        confirmed = asyncio.run(_aiormq_loop(url, exchange, parts, INFLIGHT))
    elif kind == "aiormq-sequential":
        confirmed = asyncio.run(_aiormq_loop(url, exchange, parts, 1))
    elif kind == "aio-pika-32":
        confirmed = asyncio.run(_aio_pika_loop(url, exchange, parts, INFLIGHT))
    elif kind == "pika-blocking":
        confirmed = _pika_loop(url, exchange, parts)
    else:
        raise ValueError(kind)
    seconds = time.perf_counter() - started
    return {"rate": confirmed / seconds, "confirmed": confirmed, "seconds": seconds}


def destination_alone(url: str, exchange: str, messages: int, barrier: Barrier) -> dict[str, Any]:
    """The destination without the relay (in a spawned process): ``deliver`` called with batches of 100
    messages made beforehand, as the relay would hand them over. Separates the destination's own cost
    from the relay's (claim, settle: the database's work)."""
    from datetime import UTC, datetime

    from outbox_pipelines.core.destinations.rabbitmq.destination import RabbitMQDestination
    from outbox_pipelines.core.models import ClaimedMessage

    now = datetime.now(UTC)
    batch = [
        ClaimedMessage(
            id=n,
            event_id=f"alone-{n}",
            tenant_id=None,
            topic=TOPIC,
            payload=sample_payload(n),
            payload_sha="",
            headers={},
            attempts=1,
            created_at=now,
        )
        for n in range(messages)
    ]
    destination = RabbitMQDestination(url, exchange=exchange, max_in_flight=INFLIGHT)
    barrier()
    started = time.perf_counter()
    sent = 0
    try:
        for start in range(0, messages, BATCH):
            sent += sum(o.kind == "sent" for o in destination.deliver(batch[start : start + BATCH]))
    finally:
        destination.close()
    seconds = time.perf_counter() - started
    return {"rate": sent / seconds, "confirmed": sent, "seconds": seconds}


def outbox_loop(db_url: str, url: str, exchange: str, barrier: Barrier) -> dict[str, Any]:
    """The outbox loop a team writes with aiormq (in a spawned process): obench.outbox_loop's claim, batch 100,
    each 32 of it published as the aiormq-32 loop does, every confirm awaited, then the settle and COMMIT;
    msg/s from the first claim to the last commit (the channel opened before it)."""
    from obench import outbox_loop as loop

    async def run() -> tuple[int, float]:
        connection, channel = await _aiormq_channel(url, exchange)

        async def publish(rows: Any) -> int:
            parts = [(event_id, payload) for _, event_id, _, payload, _ in rows]
            confirmed = 0
            for start in range(0, len(parts), INFLIGHT):
                confirmed += await _aiormq_publish(channel, exchange, rows[start][2], parts[start : start + INFLIGHT])
            return confirmed

        try:
            barrier()
            return await loop.drain_async(db_url, TABLE, publish)
        finally:
            await connection.close()

    sent, seconds = asyncio.run(run())
    return {"sent": sent, "seconds": seconds, "rate": sent / seconds}


def relay_drain(db_url: str, url: str, exchange: str, barrier: Barrier) -> dict[str, Any]:
    """The relay draining the loaded rows into its RabbitMQ destination (in a spawned process)."""
    from dataclasses import replace

    from outbox_pipelines.core.destinations.rabbitmq.destination import build
    from outbox_pipelines.core.redaction import url_origin
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import load_settings
    from outbox_pipelines.core.settings.brokers import BrokerSettings

    broker = BrokerSettings(kind="rabbitmq", url=url, shown=url_origin(url), exchange=exchange)
    table = replace(
        load_settings(env={}, path=None).tables[TABLE],
        destination="rabbitmq",
        broker=broker,
        mode="competing",
        batch_size=BATCH,
        requests_in_flight=INFLIGHT,
    )
    destination = build(table)  # connects at its first batch: inside the clock
    relay = Relay(db_url, table, destination, worker_id="bench-rabbitmq")
    try:
        barrier()
        report = relay.run(once=True)
    finally:
        destination.close()
    return {
        "sent": report.sent,
        "retried": report.retried,
        "dead": report.dead,
        "seconds": report.seconds,
        "rate": report.sent / report.seconds if report.seconds else 0.0,
    }


def _queue_count(url: str, queue: str, purge: bool) -> int:
    """How many messages ``queue`` holds (then emptied when ``purge``)."""
    import aiormq

    async def run() -> int:
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel()
            declared = await channel.queue_declare(queue, passive=True)
            if purge:
                await channel.queue_purge(queue)
            return int(declared.message_count or 0)
        finally:
            await connection.close()

    return asyncio.run(run())


def _measure_outbox(url: str, db_url: str, messages: int, run: int, runs: int) -> float:
    from obench import outbox_loop as loop

    with loop.loaded(db_url, TABLE, messages, TOPIC, f"rabbitmq-outbox-{run}"):
        out = run_processes([(outbox_loop, (db_url, url, f"bench-{OUTBOX}"))], 300)[0]
    loop.check_table(db_url, TABLE, messages, out)
    stored = _queue_count(url, f"bench-{OUTBOX}", purge=True)
    if stored != messages:
        raise RuntimeError(f"outbox loop: {out}, the queue holds {stored}")
    log(f"  rabbitmq run {run + 1}/{runs} {OUTBOX:18s} {out['rate']:8,.0f} msg/s")
    return float(out["rate"])


def measure(db_url: str, messages: int, runs: int) -> dict[str, Any]:
    """Per-run msg/s of the relay and of each client loop, interleaved, against one RabbitMQ node."""
    from outbox_pipelines_tests.brokers.rabbitmq_server import RabbitMQ, bind_queue

    rows = make_rows(messages, TOPIC, "rabbitmq")
    # aio-pika and pika are measured for information, where installed (the destination needs aiormq only).
    loops = [kind for kind in LOOPS if kind not in OPTIONAL or importlib.util.find_spec(OPTIONAL[kind])]
    figures: dict[str, list[float]] = {"relay": [], OUTBOX: [], **{kind: [] for kind in LOOPS}}
    with RabbitMQ(prefix="outbox-bench-rabbitmq-") as node:
        version = node.version()
        pid = node.process.pid if node.process else "?"
        log(
            f"  rabbitmq: RabbitMQ {version} node {node.nodename} on port {node.port} (pid {pid}), "
            f"booted in {node.boot_seconds[0]:.1f} s"
        )
        for side in ("relay", OUTBOX, *loops):
            bind_queue(node.url, f"bench-{side}", f"bench-{side}", "#")
        for run in range(runs):
            for kind in loops:
                job = (
                    (destination_alone, (node.url, f"bench-{kind}", messages))
                    if kind == "destination-alone"
                    else (client_loop, (kind, node.url, f"bench-{kind}", messages))
                )
                out = run_processes([job], 300)[0]
                stored = _queue_count(node.url, f"bench-{kind}", purge=True)
                if out["confirmed"] != messages or stored != messages:
                    raise RuntimeError(f"{kind}: {out}, the queue holds {stored}")
                figures[kind].append(out["rate"])
                log(f"  rabbitmq run {run + 1}/{runs} {kind:18s} {out['rate']:8,.0f} msg/s")
            figures[OUTBOX].append(_measure_outbox(node.url, db_url, messages, run, runs))
            reset_table(db_url, TABLE)
            with psycopg.connect(db_url, autocommit=True) as conn:
                copy_rows(conn, TABLE, rows)
            settle_server(db_url, TABLE)
            out = run_processes([(relay_drain, (db_url, node.url, "bench-relay"))], 300)[0]
            counts = count_by_status(db_url, TABLE)
            stored = _queue_count(node.url, "bench-relay", purge=True)
            if (
                out["retried"]
                or out["dead"]
                or out["sent"] != messages
                or counts != {"sent": messages}
                or stored != messages
            ):
                raise RuntimeError(f"relay: {out}, table {counts}, the queue holds {stored}")
            figures["relay"].append(out["rate"])
            log(f"  rabbitmq run {run + 1}/{runs} {'relay':18s} {out['rate']:8,.0f} msg/s")
    return {
        "messages": messages,
        "runs": runs,
        "batch": BATCH,
        "inflight": INFLIGHT,
        "relay_msg_s": figures["relay"],
        "client_loop_msg_s": figures["aiormq-32"],
        "client_loop_sequential_msg_s": figures["aiormq-sequential"],
        "aio_pika_loop_msg_s": figures["aio-pika-32"],
        "pika_blocking_loop_msg_s": figures["pika-blocking"],
        "destination_alone_msg_s": figures["destination-alone"],
        "ratio_relay_to_client_loop": [r / c for r, c in zip(figures["relay"], figures["aiormq-32"], strict=True)],
        "outbox_loop_msg_s": figures[OUTBOX],
        "ratio_relay_to_outbox_loop": [r / o for r, o in zip(figures["relay"], figures[OUTBOX], strict=True)],
        "ratio_outbox_loop_to_client_loop": [o / c for o, c in zip(figures[OUTBOX], figures["aiormq-32"], strict=True)],
        "outbox_comparison": "the outbox loop with aiormq: FOR UPDATE SKIP LOCKED LIMIT 100, 32 publishes at a "
        "time, every confirm, UPDATE ... WHERE id = ANY, COMMIT (obench.outbox_loop)",
        "comparison": f"aiormq, {INFLIGHT} publishes then their confirms, batch after batch (confirmed, persistent, "
        "mandatory); the sequential loop, aio-pika's and pika's are for information",
        "server_version": version,
        "server": "RabbitMQ (Debian package), one node, no plugins, durable queue bound to the exchange",
    }


def main() -> None:
    from obench.brokers import run_standalone

    result, medians = run_standalone("rabbitmq", measure)
    print(
        f"RabbitMQ {result['server_version']}: relay {medians['relay_msg_s']:,.0f} msg/s; client loop (aiormq, "
        f"{INFLIGHT} in flight) {medians['client_loop_msg_s']:,.0f} msg/s; ratio "
        f"{medians['ratio_relay_to_client_loop']:.2f} (target >= 0.8); for information: sequential "
        f"{medians['client_loop_sequential_msg_s']:,.0f}, aio-pika {medians.get('aio_pika_loop_msg_s', 0):,.0f}, "
        f"pika blocking {medians.get('pika_blocking_loop_msg_s', 0):,.0f}, the destination alone (batches of "
        f"{BATCH}, no database) {medians['destination_alone_msg_s']:,.0f} msg/s; the outbox loop with aiormq "
        f"{medians['outbox_loop_msg_s']:,.0f} msg/s (relay / it {medians['ratio_relay_to_outbox_loop']:.2f}, it / "
        f"the client loop {medians['ratio_outbox_loop_to_client_loop']:.2f})"
    )


if __name__ == "__main__":
    main()
