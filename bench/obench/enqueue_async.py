"""enqueue-async: ``Outbox.enqueue_async`` and ``enqueue_many_async`` on the asyncio drivers (issue 39).

Three measurements per run, each after the tables are emptied, ``VACUUM ANALYZE``d and checkpointed, all in
one process on one event loop (asyncio's default), against the same database:

1. **One message per transaction**, the enqueue scenario's business transaction (an ``orders_biz`` row,
   the outbox row, one commit), on a psycopg ``AsyncConnection``, on an asyncpg connection inside
   ``conn.transaction()`` and through a SQLAlchemy ``AsyncSession`` on asyncpg. Ours:
   ``await outbox.enqueue_async(conn, message)``. Reference: the plain INSERT of the same row on the same
   driver, with ``json.dumps`` and ``sha256`` of the payload inside the transaction. The six variants
   take turns in blocks of 25 transactions in a shuffled order per block, as in obench/enqueue.py; one
   connection per driver, shared by its two variants.
2. **Batches of 1,000** in one transaction each: ``enqueue_many_async`` against the driver's own
   ``executemany`` of the plain INSERT (psycopg ``AsyncCursor.executemany``, asyncpg
   ``conn.executemany``) and its ``COPY`` (psycopg ``cursor.copy``, asyncpg ``copy_records_to_table``),
   from the same dicts, ``json.dumps`` inside the clock. Rotating order, garbage collected outside the
   clock before each call (and a second pass without, for information), as obench/enqueue.py does.
3. **200 coroutines on a pool of 10 connections**, each coroutine running business transactions
   one after another (acquire, transaction, release): messages/s of ours against the same with the plain
   INSERT, on an asyncpg ``Pool`` (min = max = 10) and on 10 psycopg ``AsyncConnection``s handed out by
   an ``asyncio.Queue`` (psycopg_pool is not installed; ours and the reference use the same pool). A
   ticker task sleeps 1 ms in a loop meanwhile; the event loop's worst stall is the largest time it
   woke late. Ours and the reference take turns in rounds, in an alternating order.

Figures are medians over the runs, ratios medians of per-run ratios.
"""

import asyncio
import gc
import hashlib
import json
import random
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

import asyncpg
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from obench import peers
from obench.common import (
    Figure,
    ScenarioResult,
    Sizes,
    Target,
    log,
    percentile,
    reset_table,
    sample_payload,
    settle_server,
)
from obench.enqueue import BLOCK, BUSINESS_DDL, BUSINESS_INSERT, TABLE, TOPIC, WARM_UP
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.storage.db import sqlalchemy_url

COLUMNS = ("event_id", "topic", "payload", "payload_sha", "headers")
PSYCOPG_PLAIN = (
    sql.SQL("INSERT INTO {} (event_id, topic, payload, payload_sha, headers) VALUES (%s, %s, %s::jsonb, %s, %s::jsonb)")
    .format(sql.Identifier(TABLE))
    .as_string()
)
ASYNCPG_PLAIN = (
    f'INSERT INTO "{TABLE}" (event_id, topic, payload, payload_sha, headers) VALUES ($1, $2, $3::jsonb, $4, $5::jsonb)'
)
ASYNCPG_BUSINESS = "INSERT INTO orders_biz (body) VALUES ($1::jsonb)"
PSYCOPG_COPY = (
    sql.SQL("COPY {} (event_id, topic, payload, payload_sha, headers) FROM STDIN")
    .format(sql.Identifier(TABLE))
    .as_string()
)

VARIANTS = (
    "psycopg-ours",
    "psycopg-plain",
    "asyncpg-ours",
    "asyncpg-plain",
    "sqlalchemy-asyncpg-ours",
    "sqlalchemy-asyncpg-plain",
)
BATCH = 1_000
BATCH_VARIANTS = (
    "psycopg-ours",
    "psycopg-executemany",
    "psycopg-copy",
    "asyncpg-ours",
    "asyncpg-executemany",
    "asyncpg-copy",
)
COROUTINES = 200
POOL_SIZE = 10
TICK_S = 0.001
POOL_VARIANTS = ("psycopg-ours", "psycopg-plain", "asyncpg-ours", "asyncpg-plain")
POOL_ROUNDS = 3
# Per transaction: the business body, our Message (whose payload and headers the plain INSERT serialises).
Item = tuple[dict[str, Any], Message]
OneTxn = Callable[[Item], Awaitable[None]]


def _items(count: int, tag: str) -> list[Item]:
    return [
        (
            sample_payload(n),
            Message(
                topic=TOPIC,
                payload=sample_payload(n),
                event_id=f"{tag}-{n}-{uuid.uuid4().hex[:8]}",
                headers={"trace_id": uuid.uuid4().hex},
            ),
        )
        for n in range(count)
    ]


def _plain_params(message: Message) -> tuple[str, str, str, str, str]:
    """What an application writing the outbox row by hand computes inside its transaction."""
    payload = json.dumps(message.payload)
    return (
        message.event_id or "",
        message.topic,
        payload,
        hashlib.sha256(payload.encode()).hexdigest(),
        json.dumps(message.headers),
    )


# -- transactions, per driver --------------------------------------------------------------


def _psycopg_txns(outbox: Outbox) -> dict[str, Callable[[psycopg.AsyncConnection, Item], Awaitable[None]]]:
    async def ours(conn: psycopg.AsyncConnection, item: Item) -> None:
        body, message = item
        async with conn.cursor() as cur:
            await cur.execute(BUSINESS_INSERT, (Jsonb(body),))
        await outbox.enqueue_async(conn, message)
        await conn.commit()

    async def plain(conn: psycopg.AsyncConnection, item: Item) -> None:
        body, message = item
        params = _plain_params(message)
        async with conn.cursor() as cur:
            await cur.execute(BUSINESS_INSERT, (Jsonb(body),))
            await cur.execute(PSYCOPG_PLAIN, params)
        await conn.commit()

    return {"ours": ours, "plain": plain}


def _asyncpg_txns(outbox: Outbox) -> dict[str, Callable[[Any, Item], Awaitable[None]]]:
    async def ours(conn: Any, item: Item) -> None:
        body, message = item
        async with conn.transaction():
            await conn.execute(ASYNCPG_BUSINESS, json.dumps(body))
            await outbox.enqueue_async(conn, message)

    async def plain(conn: Any, item: Item) -> None:
        body, message = item
        async with conn.transaction():
            await conn.execute(ASYNCPG_BUSINESS, json.dumps(body))
            await conn.execute(ASYNCPG_PLAIN, *_plain_params(message))

    return {"ours": ours, "plain": plain}


def _sqlalchemy_txns(outbox: Outbox, sessions: Any) -> dict[str, OneTxn]:
    from sqlalchemy import text

    business = text("INSERT INTO orders_biz (body) VALUES (CAST(:body AS jsonb))")
    plain_insert = text(
        f'INSERT INTO "{TABLE}" (event_id, topic, payload, payload_sha, headers) '
        "VALUES (:event_id, :topic, CAST(:payload AS jsonb), :payload_sha, CAST(:headers AS jsonb))"
    )

    async def ours(item: Item) -> None:
        body, message = item
        async with sessions() as session, session.begin():
            await session.execute(business, {"body": json.dumps(body)})
            await outbox.enqueue_async(session, message)

    async def plain(item: Item) -> None:
        body, message = item
        async with sessions() as session, session.begin():
            await session.execute(business, {"body": json.dumps(body)})
            await session.execute(plain_insert, dict(zip(COLUMNS, _plain_params(message), strict=True)))

    return {"ours": ours, "plain": plain}


def _asyncpg_url(url: str) -> str:
    return "postgresql+asyncpg://" + sqlalchemy_url(url).split("://", 1)[1]


# -- 1. one message per transaction ---------------------------------------------------------


def _one_row_count(sizes: Sizes) -> int:
    """Transactions per variant and run: two thirds of the sync scenario's (six variants here, so that
    five runs of the whole scenario take about five minutes)."""
    return max(sizes.enqueue_transactions * 2 // 3 // BLOCK, 1) * BLOCK


async def _one_row(url: str, sizes: Sizes, run_index: int, conns: dict[str, Any], sessions: Any) -> dict[str, Any]:
    """Mean and median ms per transaction of each variant, variants taking turns in shuffled blocks."""
    outbox = Outbox(TABLE)
    pg_txns, apg_txns = _psycopg_txns(outbox), _asyncpg_txns(outbox)
    sa_txns = _sqlalchemy_txns(outbox, sessions)
    pg, apg = conns["psycopg"], conns["asyncpg"]

    def bound(txn: Callable[[Any, Item], Awaitable[None]], conn: Any) -> OneTxn:
        return lambda item: txn(conn, item)

    one_txn: dict[str, OneTxn] = {
        "psycopg-ours": bound(pg_txns["ours"], pg),
        "psycopg-plain": bound(pg_txns["plain"], pg),
        "asyncpg-ours": bound(apg_txns["ours"], apg),
        "asyncpg-plain": bound(apg_txns["plain"], apg),
        "sqlalchemy-asyncpg-ours": sa_txns["ours"],
        "sqlalchemy-asyncpg-plain": sa_txns["plain"],
    }
    n = _one_row_count(sizes)
    work = {v: _items(n, f"{v}-r{run_index}") for v in VARIANTS}
    for variant in VARIANTS:  # connections, prepared statements and caches warmed outside the clock
        for item in _items(WARM_UP, f"warm-{variant}-r{run_index}"):
            await one_txn[variant](item)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = random.Random(run_index)
    for start in range(0, n, BLOCK):
        block = range(start, min(start + BLOCK, n))
        for variant in order.sample(VARIANTS, len(VARIANTS)):
            one, items, times = one_txn[variant], work[variant], samples[variant]
            for i in block:
                t0 = time.perf_counter()
                await one(items[i])
                times.append(time.perf_counter() - t0)
    return {
        "mean_ms": {v: sum(samples[v]) / len(samples[v]) * 1000.0 for v in VARIANTS},
        "p50_ms": {v: percentile(samples[v], 50) * 1000.0 for v in VARIANTS},
        "rows": len(VARIANTS) * (n + WARM_UP),
    }


# -- 2. batches of 1,000 ----------------------------------------------------------------------


def _batch_items(run_index: int, n: int, variant: str) -> list[peers.EnqueueItem]:
    return [
        (
            f"ab{run_index}-{variant}-{n}-{i}-{uuid.uuid4().hex[:8]}",
            TOPIC,
            sample_payload(i),
            {"trace_id": uuid.uuid4().hex},
        )
        for i in range(BATCH)
    ]


def _batch_calls(pg: psycopg.AsyncConnection, apg: Any) -> dict[str, Callable[[list[Any]], Awaitable[None]]]:
    """One committed batch of 1,000 per variant, each from the same kind of input (dicts)."""
    outbox = Outbox(TABLE)

    def messages(items: list[peers.EnqueueItem]) -> list[Message]:
        return [Message(topic=t, payload=p, event_id=e, headers=h) for e, t, p, h in items]

    async def psycopg_ours(items: list[peers.EnqueueItem]) -> None:
        await outbox.enqueue_many_async(pg, messages(items))
        await pg.commit()

    async def psycopg_executemany(items: list[peers.EnqueueItem]) -> None:
        rows = [peers._plain_row(item) for item in items]
        async with pg.cursor() as cur:
            await cur.executemany(PSYCOPG_PLAIN, rows)
        await pg.commit()

    async def psycopg_copy(items: list[peers.EnqueueItem]) -> None:
        async with pg.cursor() as cur, cur.copy(PSYCOPG_COPY) as copy:
            for item in items:
                await copy.write_row(peers._plain_row(item))
        await pg.commit()

    async def asyncpg_ours(items: list[peers.EnqueueItem]) -> None:
        async with apg.transaction():
            await outbox.enqueue_many_async(apg, messages(items))

    async def asyncpg_executemany(items: list[peers.EnqueueItem]) -> None:
        async with apg.transaction():
            await apg.executemany(ASYNCPG_PLAIN, [peers._plain_row(item) for item in items])

    async def asyncpg_copy(items: list[peers.EnqueueItem]) -> None:
        async with apg.transaction():
            await apg.copy_records_to_table(
                TABLE, records=[peers._plain_row(item) for item in items], columns=list(COLUMNS)
            )

    return {
        "psycopg-ours": psycopg_ours,
        "psycopg-executemany": psycopg_executemany,
        "psycopg-copy": psycopg_copy,
        "asyncpg-ours": asyncpg_ours,
        "asyncpg-executemany": asyncpg_executemany,
        "asyncpg-copy": asyncpg_copy,
    }


class _Ticker:
    """A task that sleeps ``TICK_S`` in a loop and keeps how late it woke: every lateness, and the largest
    per label (what the caller says is running when the ticker wakes)."""

    def __init__(self) -> None:
        self.label = ""
        self.worst: dict[str, float] = {}
        self.lates: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(TICK_S)
            late = time.perf_counter() - t0 - TICK_S
            self.lates.append(late)
            if late > self.worst.get(self.label, 0.0):
                self.worst[self.label] = late
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    async def tick(self) -> None:
        """Return once the ticker has woken again: its next sleep starts now, so a lateness it then
        reports falls within what runs from here on (a label set now is never charged for the past)."""
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


async def _timed_batches(
    calls: dict[str, Callable[[list[Any]], Awaitable[None]]],
    run_index: int,
    batches: int,
    settle_gc: bool,
    ticker: _Ticker,
) -> dict[str, float]:
    """Seconds each variant took for ``batches`` committed batches of 1,000, variants taking turns; the
    ticker's lateness while a call runs is charged to its variant (the harness's input building to none)."""
    seconds = {v: 0.0 for v in BATCH_VARIANTS}
    for n in range(batches):
        shift = n % len(BATCH_VARIANTS)
        for variant in BATCH_VARIANTS[shift:] + BATCH_VARIANTS[:shift]:
            items = _batch_items(run_index, n if settle_gc else batches + n, variant)
            if settle_gc:
                gc.collect()
            await ticker.tick()
            ticker.label = variant
            t0 = time.perf_counter()
            await calls[variant](items)
            seconds[variant] += time.perf_counter() - t0
            await ticker.tick()  # the call's last synchronous stretch is still charged to it
            ticker.label = ""
    return seconds


async def _batches(url: str, sizes: Sizes, run_index: int, conns: dict[str, Any]) -> dict[str, Any]:
    batches = max(sizes.enqueue_transactions // 250, 3)  # 12 batches of 1,000 per pass (--quick: 3)
    calls = _batch_calls(conns["psycopg"], conns["asyncpg"])
    for variant in BATCH_VARIANTS:  # warm-up: prepared statements, type introspection
        await calls[variant](_batch_items(run_index, -1, variant))
    out: dict[str, Any] = {}
    for key, settle_gc in (("settled", True), ("unsettled", False)):
        ticker = _Ticker()
        ticker.start()
        try:
            seconds = await _timed_batches(calls, run_index, batches, settle_gc, ticker)
        finally:
            await ticker.stop()
        out[key] = {v: batches * BATCH / seconds[v] for v in BATCH_VARIANTS}
        out[f"{key}_worst_stall_ms"] = {v: ticker.worst.get(v, 0.0) * 1000.0 for v in BATCH_VARIANTS}
    out["rows"] = (2 * batches + 1) * BATCH * len(BATCH_VARIANTS)
    return out


# -- 3. 200 coroutines on a pool of 10 ------------------------------------------------------


class _QueuePool:
    """10 psycopg AsyncConnections handed out by an asyncio.Queue (psycopg_pool is not installed)."""

    def __init__(self, conns: list[psycopg.AsyncConnection]) -> None:
        self.conns = conns
        self._free: asyncio.Queue[psycopg.AsyncConnection] = asyncio.Queue()
        for conn in conns:
            self._free.put_nowait(conn)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[psycopg.AsyncConnection]:
        conn = await self._free.get()
        try:
            yield conn
        finally:
            self._free.put_nowait(conn)


class _GcPauses:
    """The longest pause of Python's garbage collector while installed (gc.callbacks): a stall of the event
    loop that is a collection shows here as well."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.worst = max(self.worst, time.perf_counter() - self._started)

    def __enter__(self) -> "_GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def _pool_round(
    pool: Any, txn: Callable[[Any, Item], Awaitable[None]], items: list[Item]
) -> tuple[float, _Ticker, float]:
    """``items`` enqueued by COROUTINES coroutines, one transaction each at a time on a pooled connection:
    the seconds it took, the ticker that ran meanwhile and the longest garbage collection (s). Garbage is
    collected before, outside the clock, so that no round pays for the one before."""
    per = len(items) // COROUTINES

    async def worker(mine: list[Item]) -> None:
        for item in mine:
            async with pool.acquire() as conn:
                await txn(conn, item)

    gc.collect()
    ticker = _Ticker()
    ticker.start()
    await asyncio.sleep(0)
    with _GcPauses() as pauses:
        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(worker(items[c * per : (c + 1) * per]) for c in range(COROUTINES)))
        finally:
            elapsed = time.perf_counter() - t0
            await ticker.stop()
    return elapsed, ticker, pauses.worst


async def _pools(url: str, sizes: Sizes, run_index: int, pools: dict[str, Any]) -> dict[str, Any]:
    per_round = max(sizes.enqueue_transactions // 3 // COROUTINES, 2) * COROUTINES  # 1,000 (--quick: 400)
    outbox = Outbox(TABLE)
    txns = {
        "psycopg-ours": (pools["psycopg"], _psycopg_txns(outbox)["ours"]),
        "psycopg-plain": (pools["psycopg"], _psycopg_txns(outbox)["plain"]),
        "asyncpg-ours": (pools["asyncpg"], _asyncpg_txns(outbox)["ours"]),
        "asyncpg-plain": (pools["asyncpg"], _asyncpg_txns(outbox)["plain"]),
    }
    for variant, (pool, txn) in txns.items():  # every pooled connection warmed, statements prepared
        await _pool_round(pool, txn, _items(2 * COROUTINES, f"pwarm-{variant}-r{run_index}"))
    seconds = {v: 0.0 for v in POOL_VARIANTS}
    worst = {v: 0.0 for v in POOL_VARIANTS}
    gc_worst = {v: 0.0 for v in POOL_VARIANTS}
    lates: dict[str, list[float]] = {v: [] for v in POOL_VARIANTS}
    for round_index in range(POOL_ROUNDS):
        # Ours first in even rounds (of the run index plus the round), the reference first in odd ones.
        flip = (run_index + round_index) % 2 == 1
        for driver in ("psycopg", "asyncpg"):
            pair = [f"{driver}-ours", f"{driver}-plain"]
            for variant in reversed(pair) if flip else pair:
                pool, txn = txns[variant]
                elapsed, ticker, gc_pause = await _pool_round(
                    pool, txn, _items(per_round, f"pool-{variant}-r{run_index}-{round_index}")
                )
                seconds[variant] += elapsed
                gc_worst[variant] = max(gc_worst[variant], gc_pause)
                worst[variant] = max(worst[variant], max(ticker.lates, default=0.0))
                lates[variant] += ticker.lates
    return {
        "msg_per_s": {v: POOL_ROUNDS * per_round / seconds[v] for v in POOL_VARIANTS},
        "worst_stall_ms": {v: worst[v] * 1000.0 for v in POOL_VARIANTS},
        "p99_late_ms": {v: percentile(lates[v], 99) * 1000.0 for v in POOL_VARIANTS},
        "worst_gc_pause_ms": {v: gc_worst[v] * 1000.0 for v in POOL_VARIANTS},
        "rows": len(POOL_VARIANTS) * (POOL_ROUNDS * per_round + 2 * COROUTINES),
        "per_round": per_round,
    }


# -- the run ---------------------------------------------------------------------------------


async def _check_rows(url: str, phase: str, expected: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(f'SELECT count(*) FROM "{TABLE}"')
        row = await cur.fetchone()
        stored = row[0] if row else 0
    if stored != expected:
        raise RuntimeError(f"enqueue-async {phase}: {stored} outbox rows, expected {expected}")


def _settle(url: str) -> None:
    reset_table(url, TABLE)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("TRUNCATE orders_biz")
    settle_server(url, TABLE, "orders_biz")


async def _measure(url: str, sizes: Sizes, runs: int) -> dict[str, Any]:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    # One pooled connection for the session variants, as enqueue.py's engine has (no pre-ping).
    engine = create_async_engine(_asyncpg_url(url), pool_size=1, max_overflow=0)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    pg = await psycopg.AsyncConnection.connect(url)
    apg = await asyncpg.connect(url)
    pg_pool = _QueuePool([await psycopg.AsyncConnection.connect(url) for _ in range(POOL_SIZE)])
    apg_pool = await asyncpg.create_pool(url, min_size=POOL_SIZE, max_size=POOL_SIZE)
    conns = {"psycopg": pg, "asyncpg": apg}
    per_run: list[dict[str, Any]] = []
    try:
        for run_index in range(runs):
            _settle(url)
            one = await _one_row(url, sizes, run_index, conns, sessions)
            await _check_rows(url, "one-row", one["rows"])
            log(
                f"  enqueue-async run {run_index + 1}/{runs}: "
                + ", ".join(f"{v} {one['mean_ms'][v]:.3f}" for v in VARIANTS)
                + " ms/txn"
            )
            _settle(url)
            batch = await _batches(url, sizes, run_index, conns)
            await _check_rows(url, "batches", batch["rows"])
            log(
                f"  enqueue_many_async run {run_index + 1}/{runs}: "
                + ", ".join(f"{v} {batch['settled'][v]:,.0f}" for v in BATCH_VARIANTS)
                + " msg/s (GC settled)"
            )
            _settle(url)
            pooled = await _pools(url, sizes, run_index, {"psycopg": pg_pool, "asyncpg": apg_pool})
            await _check_rows(url, "pool", pooled["rows"])
            log(
                f"  {COROUTINES} coroutines / {POOL_SIZE} connections run {run_index + 1}/{runs}: "
                + ", ".join(
                    f"{v} {pooled['msg_per_s'][v]:,.0f} msg/s (stall {pooled['worst_stall_ms'][v]:.1f} ms)"
                    for v in POOL_VARIANTS
                )
            )
            per_run.append({"one": one, "batch": batch, "pool": pooled})
    finally:
        await apg_pool.close()
        for conn in pg_pool.conns:
            await conn.close()
        await apg.close()
        await pg.close()
        await engine.dispose()
    return {"per_run": per_run}


def _by_variant(per_run: list[dict[str, Any]], phase: str, key: str) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    for run in per_run:
        for variant, value in run[phase][key].items():
            values.setdefault(variant, []).append(value)
    return values


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BUSINESS_DDL)
    per_run = asyncio.run(_measure(url, sizes, runs))["per_run"]
    mean_ms = _by_variant(per_run, "one", "mean_ms")
    p50_ms = _by_variant(per_run, "one", "p50_ms")
    settled = _by_variant(per_run, "batch", "settled")
    unsettled = _by_variant(per_run, "batch", "unsettled")
    batch_stall = _by_variant(per_run, "batch", "settled_worst_stall_ms")
    pool_rate = _by_variant(per_run, "pool", "msg_per_s")
    pool_stall = _by_variant(per_run, "pool", "worst_stall_ms")
    pool_p99 = _by_variant(per_run, "pool", "p99_late_ms")
    pool_gc = _by_variant(per_run, "pool", "worst_gc_pause_ms")
    n, per_round = _one_row_count(sizes), per_run[0]["pool"]["per_round"]
    one_target = Target("≤ 1.11× time (≥ 0.9× throughput)", ratio_max=1.0 / 0.9)
    reference = "same txn, plain INSERT of the outbox row on the same driver, json.dumps and sha256 inside the txn"
    batch_ref = "same rows, json.dumps inside the clock, one txn per batch"
    pool_ref = f"the same {COROUTINES} coroutines and pool, plain INSERT (json.dumps and sha256 inside the txn)"
    result = ScenarioResult()
    result.figures += [
        Figure(
            "enqueue-async",
            f"enqueue_async, psycopg AsyncConnection ({n:,} one-row txns)",
            "ms/txn",
            mean_ms["psycopg-ours"],
            mean_ms["psycopg-plain"],
            reference,
            one_target,
        ),
        Figure(
            "enqueue-async",
            f"enqueue_async, asyncpg connection in conn.transaction() ({n:,} one-row txns)",
            "ms/txn",
            mean_ms["asyncpg-ours"],
            mean_ms["asyncpg-plain"],
            reference,
            one_target,
        ),
        Figure(
            "enqueue-async",
            f"enqueue_async, SQLAlchemy AsyncSession on asyncpg ({n:,} one-row txns)",
            "ms/txn",
            mean_ms["sqlalchemy-asyncpg-ours"],
            mean_ms["sqlalchemy-asyncpg-plain"],
            "same session.begin(), plain session.execute(text INSERT), json.dumps and sha256 inside the txn",
            note="for information; the targets are set for the drivers' own connections",
        ),
    ]
    for driver, many, copy in (
        ("psycopg", "AsyncCursor.executemany", "cursor.copy"),
        ("asyncpg", "conn.executemany", "copy_records_to_table"),
    ):
        result.figures += [
            Figure(
                "enqueue-async",
                f"enqueue_many_async, {driver}, batches of 1,000",
                "msg/s",
                settled[f"{driver}-ours"],
                settled[f"{driver}-executemany"],
                f"{driver} {many} of the plain INSERT ({batch_ref})",
                Target("≥ 0.8× executemany", ratio_min=0.8),
            ),
            Figure(
                "enqueue-async",
                f"enqueue_many_async, {driver}, batches of 1,000, vs COPY",
                "msg/s",
                settled[f"{driver}-ours"],
                settled[f"{driver}-copy"],
                f"{driver} {copy} ({batch_ref})",
            ),
            Figure(
                "enqueue-async",
                f"enqueue_many_async, {driver}, batches of 1,000, GC not settled between calls",
                "msg/s",
                unsettled[f"{driver}-ours"],
                unsettled[f"{driver}-executemany"],
                f"{driver} {many} ({batch_ref})",
                note="the harness's garbage is collected inside whichever timed call trips the collector",
            ),
        ]
    pools = (
        ("psycopg", f"{POOL_SIZE} psycopg AsyncConnections in an asyncio.Queue"),
        ("asyncpg", f"asyncpg Pool of {POOL_SIZE}"),
    )
    for driver, pool in pools:
        result.figures += [
            Figure(
                "enqueue-async",
                f"enqueue_async, {COROUTINES} coroutines on {pool} ({POOL_ROUNDS} × {per_round:,} txns)",
                "msg/s",
                pool_rate[f"{driver}-ours"],
                pool_rate[f"{driver}-plain"],
                pool_ref,
                Target("≥ 0.85× plain INSERT", ratio_min=0.85),
            ),
            Figure(
                "enqueue-async",
                f"event loop's worst stall, {COROUTINES} coroutines on {pool}",
                "ms",
                pool_stall[f"{driver}-ours"],
                pool_stall[f"{driver}-plain"],
                "the same with the plain INSERT",
                note=f"largest lateness of a task sleeping {TICK_S * 1000:.0f} ms in a loop",
            ),
        ]
    result.details = {
        "event_loop": "asyncio default (no uvloop)",
        "packages": {p: _version(p) for p in ("psycopg", "asyncpg", "sqlalchemy", "psycopg-pool")},
        "mean_ms_per_txn": mean_ms,
        "p50_ms_per_txn": p50_ms,
        "enqueue_many_msg_per_s": settled,
        "enqueue_many_msg_per_s_gc_not_settled": unsettled,
        "enqueue_many_worst_stall_ms": batch_stall,
        "pool_msg_per_s": pool_rate,
        "pool_worst_stall_ms": pool_stall,
        "pool_p99_late_ms": pool_p99,
        "pool_worst_gc_pause_ms": pool_gc,
        "pool": {"coroutines": COROUTINES, "connections": POOL_SIZE, "rounds": POOL_ROUNDS, "per_round": per_round},
    }
    return result


def detail_lines(details: dict[str, Any]) -> list[str]:
    """The medians behind the rows: per-transaction medians, the loop's stalls."""

    def medians(values: dict[str, list[float]], fmt: str) -> str:
        return ", ".join(f"{k} {format(statistics.median(v), fmt)}" for k, v in values.items())

    pkgs = details["packages"]
    return [
        f"- **enqueue-async** ({details['event_loop']}; psycopg {pkgs['psycopg']}, asyncpg {pkgs['asyncpg']}, "
        f"SQLAlchemy {pkgs['sqlalchemy']}): median ms per one-row transaction, medians over the runs: "
        + medians(details["p50_ms_per_txn"], ".3f")
        + f". Variants take turns in blocks of {BLOCK} transactions in a shuffled order per block.",
        "  Worst event-loop stall (ms) during one batch of 1,000, medians over the runs: "
        + medians(details["enqueue_many_worst_stall_ms"], ".1f")
        + ".",
        f"  {details['pool']['coroutines']} coroutines on {details['pool']['connections']} connections: "
        "p99 lateness of the 1 ms ticker (ms), medians: "
        + medians(details["pool_p99_late_ms"], ".2f")
        + "; the longest garbage collection in a round (ms), medians: "
        + medians(details["pool_worst_gc_pause_ms"], ".1f")
        + "; worst stall per run (ms): "
        + "; ".join(f"{k} " + ", ".join(f"{x:.1f}" for x in v) for k, v in details["pool_worst_stall_ms"].items())
        + ".",
    ]
