"""http: the relay's HTTP destination against bare HTTP client loops, to one local sink.

The sink is an aiohttp server in its own process on 127.0.0.1 answering 200
with a small JSON body (uvloop when installed, so the sink costs as little CPU
as possible and the clients are what is measured). Bare loops, each in a fresh
process, keep ``inflight`` requests in flight for a fixed time:

- httpx.AsyncClient (its own pool);
- httpx.Client from a pool of ``inflight`` threads;
- httpx.AsyncClient over httpx_aiohttp.AiohttpTransport;
- aiohttp's own ClientSession.

Ours: ``Relay`` with ``HttpDestination(url, max_in_flight=inflight, transport=T)``
draining pending messages, for each transport T the core offers; msg/s = sent /
relay seconds. Each transport is compared with the bare loop of the same client
stack, and the default transport with the fastest bare loop that any of our
transports rides on (the best the relay could have picked).
"""

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from obench.common import (
    SPAWN,
    Barrier,
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
    sample_payload,
    settle_server,
    stop_process,
    track,
)

TABLE = "outbox_orders"
WARM_UP_S = 0.5
BARE_CLIENTS = ("httpx-async", "httpx-sync-threads", "httpx-aiohttp", "aiohttp-raw")
# The relay's default batch (OUTBOX_BATCH_SIZE) and the drain scenario's.
DEFAULT_BATCH = 100
BIG_BATCH = 1_000
# Which bare loop each of our transports rides on (a transport not listed here
# is still measured, without a ceiling of its own).
TRANSPORT_TO_BARE = {
    "aiohttp-native": "aiohttp-raw",
    "aiohttp": "httpx-aiohttp",
    "httpx-async": "httpx-async",
    "httpx-sync": "httpx-sync-threads",
}


# -- the sink ------------------------------------------------------------------


def sink_main(port_queue: Any, delay_s: float = 0.0) -> None:
    from aiohttp import web

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    served = 0

    async def accept(request: web.Request) -> web.Response:
        nonlocal served
        await request.read()
        if delay_s:
            await asyncio.sleep(delay_s)  # a broker's own latency (the defaults sweep)
        served += 1
        key = request.headers.get("Idempotency-Key", "")
        return web.json_response({"status": "accepted", "id": f"ref-{key}"})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"served": served})

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/_stats", stats)
        app.router.add_post("/{tail:.*}", accept)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_queue.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()  # until the parent stops this process

    asyncio.run(serve())


class Sink:
    """The local HTTP sink in its own process; ``delay_s`` is how long it takes to answer."""

    def __init__(self, delay_s: float = 0.0) -> None:
        ports = SPAWN.Queue()
        self.process = track(SPAWN.Process(target=sink_main, args=(ports, delay_s), daemon=True))
        self.process.start()
        self.url = f"http://127.0.0.1:{ports.get(timeout=30)}/events"
        self._base = self.url.rsplit("/", 1)[0]

    def served(self) -> int:
        import httpx

        return int(httpx.get(f"{self._base}/_stats").json()["served"])

    def stop(self) -> None:
        stop_process(self.process)


# -- bare client loops ---------------------------------------------------------


def _request_parts(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(sample_payload(n), separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": f"bare-{n}", "X-Outbox-Topic": "order.created"}
    return body, headers


class _Lanes:
    """``inflight`` lanes of back-to-back requests; answers counted only inside the measured window."""

    def __init__(self, inflight: int) -> None:
        self.inflight = inflight
        self.start = self.end = 0.0
        self.counted = [0] * inflight
        self.failures = [0] * inflight

    def open_window(self, seconds: float) -> None:
        self.start = time.monotonic() + WARM_UP_S
        self.end = self.start + seconds

    def running(self) -> bool:
        return time.monotonic() < self.end

    def done(self, slot: int, status: int) -> None:
        if status != 200:
            self.failures[slot] += 1
        elif self.start <= time.monotonic() < self.end:
            self.counted[slot] += 1

    async def run_async(self, post: Callable[[], Any]) -> None:
        async def lane(slot: int) -> None:
            while self.running():
                self.done(slot, await post())

        await asyncio.gather(*(lane(i) for i in range(self.inflight)))


async def _with_httpx(
    lanes: _Lanes, url: str, body: bytes, headers: dict[str, str], limits: Any, transport: Any
) -> None:
    import httpx

    client = httpx.AsyncClient(limits=limits, transport=transport) if transport else httpx.AsyncClient(limits=limits)
    async with client:

        async def post() -> int:
            return (await client.post(url, content=body, headers=headers)).status_code

        await lanes.run_async(post)


async def _with_aiohttp(lanes: _Lanes, url: str, body: bytes, headers: dict[str, str]) -> None:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=lanes.inflight)) as session:

        async def post() -> int:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                return response.status

        await lanes.run_async(post)


def _with_threads(lanes: _Lanes, url: str, body: bytes, headers: dict[str, str], limits: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    with httpx.Client(limits=limits) as client:

        def lane(slot: int) -> None:
            while lanes.running():
                lanes.done(slot, client.post(url, content=body, headers=headers).status_code)

        with ThreadPoolExecutor(lanes.inflight) as pool:
            list(pool.map(lane, range(lanes.inflight)))


def bare_client(kind: str, url: str, inflight: int, seconds: float, barrier: Barrier) -> dict[str, Any]:
    """Keep ``inflight`` requests going for WARM_UP_S + seconds; count answers in the last ``seconds``."""
    # Imported in the worker: each measured process loads only the client stack it measures.
    import httpx

    body, headers = _request_parts(1)
    lanes = _Lanes(inflight)
    limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
    barrier()
    lanes.open_window(seconds)
    if kind == "httpx-async":
        asyncio.run(_with_httpx(lanes, url, body, headers, limits, None))
    elif kind == "httpx-aiohttp":
        from httpx_aiohttp import AiohttpTransport

        asyncio.run(_with_httpx(lanes, url, body, headers, limits, AiohttpTransport(limits=limits)))
    elif kind == "aiohttp-raw":
        asyncio.run(_with_aiohttp(lanes, url, body, headers))
    elif kind == "httpx-sync-threads":
        _with_threads(lanes, url, body, headers, limits)
    else:
        raise ValueError(kind)
    return {"kind": kind, "rate": sum(lanes.counted) / seconds, "failures": sum(lanes.failures)}


# -- ours ----------------------------------------------------------------------


def ours_relay(
    url: str, sink_url: str, transport: str, inflight: int, batch: int, seconds: float, barrier: Barrier
) -> dict[str, Any]:
    from outbox_pipelines.core.destinations.http.destination import HttpDestination
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    destination = HttpDestination(sink_url, max_in_flight=inflight, transport=transport)
    table = TableSettings(
        name=TABLE,
        destination="http",
        url=sink_url,
        transport=transport,
        mode="competing",
        batch_size=batch,
        requests_in_flight=inflight,
        preset="orders",
    )
    relay = Relay(url, table, destination, worker_id=f"bench-http-{transport}")
    try:
        barrier()
        # Drain until empty, or stop at the time budget (the slow transports).
        report = relay.run(once=True, max_seconds=seconds)
    finally:
        destination.close()
    return {"sent": report.sent, "retried": report.retried, "dead": report.dead, "seconds": report.seconds}


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    from outbox_pipelines.core.destinations.http.destination import DEFAULT_TRANSPORT, TRANSPORTS

    result = ScenarioResult()
    rows = make_rows(sizes.http_messages, "order.created", "http")
    bare: dict[str, list[float]] = {k: [] for k in BARE_CLIENTS}
    # Each case is (transport, batch size): every transport at the default batch
    # (OUTBOX_BATCH_SIZE = 100), and the default transport at batch 1,000 too.
    cases = [(t, DEFAULT_BATCH) for t in TRANSPORTS] + [(DEFAULT_TRANSPORT, BIG_BATCH)]
    ours: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    sink = Sink()
    log(f"  HTTP sink on {sink.url} (pid {sink.process.pid})")
    try:
        for run_index in range(runs):
            for kind in BARE_CLIENTS:
                out = run_processes([(bare_client, (kind, sink.url, sizes.http_inflight, sizes.http_seconds))], 120)[0]
                if out["failures"]:
                    raise RuntimeError(f"bare {kind}: {out['failures']} non-200 answers from the sink")
                bare[kind].append(out["rate"])
                log(f"  http run {run_index + 1}/{runs} bare {kind:20s} {out['rate']:8,.0f} req/s")
            for transport, batch in cases:
                reset_table(url, TABLE)
                with psycopg.connect(url, autocommit=True) as conn:
                    copy_rows(conn, TABLE, rows)
                settle_server(url, TABLE)
                before = sink.served()
                out = run_processes(
                    [(ours_relay, (url, sink.url, transport, sizes.http_inflight, batch, sizes.http_seconds + 2.0))],
                    300,
                )[0]
                served = sink.served() - before
                counts = count_by_status(url, TABLE)
                if out["retried"] or out["dead"] or served != out["sent"] or counts.get("sent", 0) != out["sent"]:
                    raise RuntimeError(f"ours {transport}: {out}, sink served {served}, table {counts}")
                rate = out["sent"] / out["seconds"]
                ours[(transport, batch)].append(rate)
                log(
                    f"  http run {run_index + 1}/{runs} ours transport={transport:12s} batch {batch:5,d} "
                    f"{rate:8,.0f} msg/s ({out['sent']:,} sent)"
                )
    finally:
        sink.stop()
    # The bare clients one of our transports rides on: the relay's real choices
    # (today all four, so the reference is the fastest client of all).
    choices = sorted({TRANSPORT_TO_BARE[t] for t in TRANSPORTS if t in TRANSPORT_TO_BARE})
    medians = {k: statistics.median(v) for k, v in bare.items()}
    fastest = max(choices, key=lambda k: medians[k])
    fastest_per_run = [max(bare[k][i] for k in choices) for i in range(runs)]
    for kind in BARE_CLIENTS:
        result.figures.append(
            Figure(
                "http",
                f"http bare {kind}, {sizes.http_inflight} in flight",
                "req/s",
                bare[kind],
                note="bare client loop",
            )
        )
    for transport, batch in cases:
        result.figures.append(
            Figure(
                "http",
                f"http relay transport={transport}, batch {batch:,}",
                "msg/s",
                ours[(transport, batch)],
                bare[TRANSPORT_TO_BARE[transport]] if transport in TRANSPORT_TO_BARE else [],
                f"bare {TRANSPORT_TO_BARE.get(transport, '?')}",
                note="same client stack without the relay; for information",
            )
        )
    result.figures.append(
        Figure(
            "http",
            f"http relay, default transport ({DEFAULT_TRANSPORT}, batch {DEFAULT_BATCH}) "
            f"vs fastest bare client our transports ride on ({fastest})",
            "msg/s",
            ours[(DEFAULT_TRANSPORT, DEFAULT_BATCH)],
            fastest_per_run,
            "fastest bare client in the same run",
            Target("≥ 0.8× ceiling and ≥ 2,000 msg/s", ratio_min=0.8, value_min=2000.0),
        )
    )
    result.details.update(
        {
            "fastest_bare_client": fastest,
            "bare_clients_ours_can_ride_on": choices,
            "default_transport": DEFAULT_TRANSPORT,
            "default_transport_rides_on": TRANSPORT_TO_BARE.get(DEFAULT_TRANSPORT),
            "default_is_fastest": TRANSPORT_TO_BARE.get(DEFAULT_TRANSPORT) == fastest,
            "inflight": sizes.http_inflight,
            "messages_loaded": sizes.http_messages,
            "default_batch_size": DEFAULT_BATCH,
        }
    )
    return result
