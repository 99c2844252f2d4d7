"""The one-row enqueue against a plain INSERT of the same row (issue 47, item 4), and what each piece between costs.

    .venv/bin/python bench/enqueue_vs_insert.py --runs 5                   # this tree
    .venv/bin/python bench/enqueue_vs_insert.py --runs 5 --tree /tmp/before  # git archive … outbox_pipelines sql

A business transaction (one ``orders_biz`` row, the outbox row, one commit) on one connection, three ways:
(a) ``Outbox.enqueue`` / ``enqueue_async``; (b) ``user``: the INSERT a team writes for its own outbox table
(``user_outbox``: id, event_id UNIQUE, topic, payload, headers, created_at, published_at, one partial index
for the relay), ``json.dumps`` of payload and headers, no digest, no RETURNING, no trigger; (c) ``reference``:
the reference of ``bench/run.py --scenario enqueue``: a plain INSERT into the outbox table itself (its indexes
and triggers), with ``json.dumps`` and ``sha256`` of the payload inside the transaction. Between (b) and (a), one
piece at a time (sync psycopg): the outbox table's columns and indexes (a copy without triggers), its payload
limit trigger, its NOTIFY trigger (= c), ``ON CONFLICT``, ``RETURNING id``, the enqueue's checks and canonical
JSON (``_prepare_one``), then ``Outbox.enqueue`` itself. Asyncio: the same (a), (b), (c) on a psycopg
``AsyncConnection`` and on asyncpg. Variants take turns in blocks of 25 transactions, shuffled per block; each
run starts from emptied, vacuumed tables and a checkpoint. µs per transaction (mean of the run), medians over
runs; ratios: medians of per-run ratios of throughput (reference time / ours) [lowest–highest]. Beside each
wall time, the CPU it took: this process's (``time.thread_time``) and the server backend's (Linux's
/proc/PID/schedstat; 0 for a server elsewhere), which a busy machine inflates far less than wall times. Then the
server's share alone: a DO block per table shape, each iteration a business row, an outbox row and a COMMIT; and,
in turns, the payload-limit and NOTIFY triggers as migrations 0020/0001 wrote them against the tree's (0023 on).
Results and their reading: bench/results.md, "Issue 47, item 4".
"""

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BLOCK = 25
WARM_UP = 30
TOPIC = "order.created"
OURS = "outbox_events"
USER_DDL = """
CREATE TABLE IF NOT EXISTS user_outbox (
    id bigserial PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    topic text NOT NULL,
    payload jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX IF NOT EXISTS user_outbox_unpublished ON user_outbox (id) WHERE published_at IS NULL;
CREATE TABLE IF NOT EXISTS orders_biz (id bigserial PRIMARY KEY, body jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS outbox_bare (LIKE outbox_events INCLUDING ALL);
CREATE TABLE IF NOT EXISTS outbox_limit (LIKE outbox_events INCLUDING ALL);
CREATE TABLE IF NOT EXISTS triggers_then (LIKE outbox_events INCLUDING ALL);
CREATE TABLE IF NOT EXISTS triggers_now (LIKE outbox_events INCLUDING ALL);
CREATE TABLE IF NOT EXISTS outbox_keys (LIKE outbox_events INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS);
ALTER TABLE outbox_keys DROP CONSTRAINT IF EXISTS outbox_keys_pkey, DROP CONSTRAINT IF EXISTS outbox_keys_event_id_key;
ALTER TABLE outbox_keys ADD PRIMARY KEY (id), ADD UNIQUE (event_id);
"""
TABLES = (
    "outbox_events",
    "outbox_bare",
    "outbox_limit",
    "outbox_keys",
    "user_outbox",
    "orders_biz",
    "triggers_then",
    "triggers_now",
)
# The payload-limit trigger (limit 1 MiB) and the NOTIFY trigger as migrations 0020 and 0001 wrote them, before
# 0023: on triggers_then, against the tree's own on triggers_now, in the same runs (the server's share, below).
TRIGGERS_THEN = """
CREATE OR REPLACE FUNCTION bench_payload_limit_0020() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
    payload_bytes pg_catalog.int4 := pg_catalog.octet_length(NEW.payload::pg_catalog.text);
    headers_bytes pg_catalog.int4 := pg_catalog.octet_length(NEW.headers::pg_catalog.text);
BEGIN
    IF pg_catalog.int4gt(payload_bytes, 1048576) OR pg_catalog.int4gt(headers_bytes, 1048576) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_payload_max_1048576_bytes',
            MESSAGE = pg_catalog.format('%s of %s bytes over the limit of 1048576 bytes of outbox table %s',
                CASE WHEN pg_catalog.int4gt(payload_bytes, 1048576) THEN 'payload' ELSE 'headers' END,
                CASE WHEN pg_catalog.int4gt(payload_bytes, 1048576) THEN payload_bytes ELSE headers_bytes END,
                'outbox_events');
    END IF;
    NEW.json_bytes := pg_catalog.int4pl(payload_bytes, headers_bytes);
    RETURN NEW;
END
$body$;
CREATE OR REPLACE FUNCTION bench_notify_0001() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    PERFORM pg_notify('outbox:' || TG_TABLE_NAME, '');
    RETURN NULL;
END
$body$;
CREATE OR REPLACE TRIGGER outbox_payload_limit BEFORE INSERT ON triggers_then FOR EACH ROW
    EXECUTE FUNCTION bench_payload_limit_0020();
CREATE OR REPLACE TRIGGER outbox_notify_insert AFTER INSERT ON triggers_then FOR EACH STATEMENT
    EXECUTE FUNCTION bench_notify_0001();
CREATE OR REPLACE TRIGGER outbox_notify_insert AFTER INSERT ON triggers_now FOR EACH STATEMENT
    EXECUTE FUNCTION outbox_notify_insert();
"""
BUSINESS = "INSERT INTO orders_biz (body) VALUES (%s::jsonb)"
USER_INSERT = "INSERT INTO user_outbox (event_id, topic, payload, headers) VALUES (%s, %s, %s::jsonb, %s::jsonb)"
PLAIN = 'INSERT INTO "{t}" (event_id, topic, payload, payload_sha, headers) VALUES (%s, %s, %s::jsonb, %s, %s::jsonb)'
ON_CONFLICT = " ON CONFLICT (event_id) DO NOTHING"
SYNC_VARIANTS = (
    "user: plain INSERT, own table (b)",
    "+ payload_sha (sha256), outbox columns and indexes, no trigger",
    "+ payload-limit trigger",
    "+ NOTIFY trigger: the outbox table (c, the reference)",
    "+ ON CONFLICT (event_id) DO NOTHING",
    "+ RETURNING id",
    "+ the enqueue's checks and canonical JSON (_prepare_one), its statement",
    "Outbox.enqueue(cur, message) (a)",
    "Outbox.enqueue(conn, message)",
)
ASYNC_VARIANTS = (
    "psycopg async: user (b)",
    "psycopg async: reference (c)",
    "psycopg async: enqueue_async (a)",
    "asyncpg: user (b)",
    "asyncpg: reference (c)",
    "asyncpg: enqueue_async (a)",
)


def _dollar(statement: str) -> str:
    parts = statement.split("%s")
    return "".join(part + (f"${i + 1}" if i < len(parts) - 1 else "") for i, part in enumerate(parts))


def _items(count: int, tag: str, sample_payload: Callable[[int], dict[str, Any]], message: Any) -> list[Any]:
    return [
        (
            json.dumps(sample_payload(n)),
            message(
                topic=TOPIC,
                payload=sample_payload(n),
                event_id=f"{tag}-{n}-{uuid.uuid4().hex[:8]}",
                headers={"trace_id": uuid.uuid4().hex},
            ),
        )
        for n in range(count)
    ]


def _user(message: Any) -> tuple[str, str, str, str]:
    return (message.event_id, message.topic, json.dumps(message.payload), json.dumps(message.headers))


def _hashed(message: Any) -> tuple[str, str, str, str, str]:
    payload = json.dumps(message.payload)
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return (message.event_id, message.topic, payload, digest, json.dumps(message.headers))


def sync_variants(pg: Any, mod: Any) -> dict[str, Callable[[Any], None]]:
    """One business transaction per variant on the psycopg connection ``pg``, each committing once."""
    outbox = mod.Outbox(OURS)
    ours_statement = mod.table_query("outbox_insert", OURS)
    limit = outbox.max_payload_bytes

    def on_cursor(write: Callable[[Any, Any], Any]) -> Callable[[Any], None]:
        def txn(item: Any) -> None:
            body, message = item
            with pg.cursor() as cur:
                cur.execute(BUSINESS, (body,))
                write(cur, message)
            pg.commit()

        return txn

    def plain(statement: str, params: Callable[[Any], tuple[Any, ...]], fetch: bool = False) -> Callable[..., Any]:
        def write(cur: Any, message: Any) -> None:
            cur.execute(statement, params(message))
            if fetch:
                cur.fetchone()

        return write

    def prepared(cur: Any, message: Any) -> None:
        row = mod.prepare_one(message, limit)
        cur.execute(ours_statement, (*row[:6], None))
        cur.fetchone()

    def on_connection(item: Any) -> None:
        body, message = item
        with pg.cursor() as cur:
            cur.execute(BUSINESS, (body,))
        outbox.enqueue(pg, message)
        pg.commit()

    full = PLAIN.format(t=OURS)
    writes = (
        plain(USER_INSERT, _user),
        plain(PLAIN.format(t="outbox_bare"), _hashed),
        plain(PLAIN.format(t="outbox_limit"), _hashed),
        plain(full, _hashed),
        plain(full + ON_CONFLICT, _hashed),
        plain(full + ON_CONFLICT + " RETURNING id", _hashed, fetch=True),
        prepared,
        outbox.enqueue,
    )
    variants = {name: on_cursor(write) for name, write in zip(SYNC_VARIANTS, writes, strict=False)}
    variants[SYNC_VARIANTS[-1]] = on_connection
    return variants


def async_variants(pg: Any, apg: Any, mod: Any) -> dict[str, Callable[[Any], Awaitable[None]]]:
    outbox = mod.Outbox(OURS)
    full = PLAIN.format(t=OURS)

    def psycopg_txn(write: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[None]]:
        async def txn(item: Any) -> None:
            body, message = item
            async with pg.cursor() as cur:
                await cur.execute(BUSINESS, (body,))
                await write(cur, message)
            await pg.commit()

        return txn

    def asyncpg_txn(write: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[None]]:
        async def txn(item: Any) -> None:
            body, message = item
            async with apg.transaction():
                await apg.execute(_dollar(BUSINESS), body)
                await write(apg, message)

        return txn

    async def p_user(cur: Any, message: Any) -> None:
        await cur.execute(USER_INSERT, _user(message))

    async def p_reference(cur: Any, message: Any) -> None:
        await cur.execute(full, _hashed(message))

    async def a_user(conn: Any, message: Any) -> None:
        await conn.execute(_dollar(USER_INSERT), *_user(message))

    async def a_reference(conn: Any, message: Any) -> None:
        await conn.execute(_dollar(full), *_hashed(message))

    writes = (p_user, p_reference, outbox.enqueue_async, a_user, a_reference, outbox.enqueue_async)
    return {
        name: (psycopg_txn if name.startswith("psycopg") else asyncpg_txn)(write)
        for name, write in zip(ASYNC_VARIANTS, writes, strict=True)
    }


def _server_ns(pid: int) -> int:
    """The CPU time (ns) the server process ``pid`` has run, from Linux's /proc/PID/schedstat; 0 where unreadable
    (a server on another machine): the server column then reads 0."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _per_transaction(
    totals: dict[str, float], cpu: dict[str, float], server: dict[str, float], count: int
) -> dict[str, float]:
    """µs per transaction: wall time by variant name, this process's CPU time by ``name|cpu``, the server
    backend's by ``name|server``."""
    figures = {name: total / count * 1e6 for name, total in totals.items()}
    figures.update({f"{name}|cpu": total / count * 1e6 for name, total in cpu.items()})
    figures.update({f"{name}|server": total / count / 1e3 for name, total in server.items()})
    return figures


class _Meter:
    """Wall, this thread's CPU and the server backend's CPU per variant, over the blocks of a run: the one
    schedule and tally of ``_blocks`` and ``_async_blocks``."""

    def __init__(self, variants: dict[str, Any], count: int, seed: int, pids: dict[str, int]) -> None:
        self.variants, self.count, self.seed, self.pids = variants, count, seed, pids
        self.totals, self.cpu, self.server = (dict.fromkeys(variants, 0.0) for _ in range(3))

    def schedule(self) -> Iterator[tuple[str, range]]:
        """Each block's variants in a random order, each with the indexes of its items in the block."""
        order = random.Random(self.seed)
        for start in range(0, self.count, BLOCK):
            for name in order.sample(list(self.variants), len(self.variants)):
                yield name, range(start, min(start + BLOCK, self.count))

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        t0, c0, s0 = time.perf_counter(), time.thread_time(), _server_ns(self.pids[name])
        yield
        self.totals[name] += time.perf_counter() - t0
        self.cpu[name] += time.thread_time() - c0
        self.server[name] += _server_ns(self.pids[name]) - s0

    def figures(self) -> dict[str, float]:
        return _per_transaction(self.totals, self.cpu, self.server, self.count)


def _blocks(
    variants: dict[str, Any], work: dict[str, list[Any]], count: int, seed: int, pids: dict[str, int]
) -> dict[str, float]:
    meter = _Meter(variants, count, seed, pids)
    for name, block in meter.schedule():
        txn, items = variants[name], work[name]
        with meter.timing(name):
            for n in block:
                txn(items[n])
    return meter.figures()


async def _async_blocks(
    variants: dict[str, Any], work: dict[str, list[Any]], count: int, seed: int, pids: dict[str, int]
) -> dict[str, float]:
    meter = _Meter(variants, count, seed, pids)
    for name, block in meter.schedule():
        txn, items = variants[name], work[name]
        with meter.timing(name):
            for n in block:
                await txn(items[n])
    return meter.figures()


def _reset(url: str, mod: Any) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE " + ", ".join(TABLES) + ", outbox_audit RESTART IDENTITY")  # constant names
    mod.settle_server(url, *TABLES)


def _setup(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(USER_DDL)
        # The copy with the payload-limit trigger: the outbox table's own function, on the copy.
        function = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = 'outbox_events'::regclass AND t.tgname = 'outbox_payload_limit'"
        ).fetchone()
        assert function is not None, "the outbox table has its payload-limit trigger"
        name = function[0].removesuffix("()")
        for table in ("outbox_limit", "triggers_now"):
            conn.execute(
                f"CREATE OR REPLACE TRIGGER outbox_payload_limit BEFORE INSERT ON {table} FOR EACH ROW "
                f"EXECUTE FUNCTION {name}()"  # a name read from the catalogue, not an input; constant tables
            )
        conn.execute(TRIGGERS_THEN)


def _modules(tree: str | None) -> Any:
    if tree:
        sys.path.insert(0, str(Path(tree).resolve()))
    sys.path.insert(0, str(HERE))
    from obench.common import BenchServer, sample_payload, settle_server

    import outbox_pipelines
    from outbox_pipelines.core import prepare
    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message
    from outbox_pipelines.core.storage.queries import table_query

    class Modules:
        pass

    mod = Modules()
    mod.BenchServer, mod.sample_payload, mod.settle_server = BenchServer, sample_payload, settle_server  # type: ignore[attr-defined]
    mod.Outbox, mod.Message, mod.table_query = Outbox, Message, table_query  # type: ignore[attr-defined]
    mod.prepare_one = prepare._prepare_one  # type: ignore[attr-defined]
    mod.where = str(Path(outbox_pipelines.__file__).resolve().parents[1])  # type: ignore[attr-defined]
    return mod


def run(url: str, mod: Any, runs: int, count: int, synchronous_commit: str) -> dict[str, list[float]]:
    import asyncpg
    import psycopg

    per_run: dict[str, list[float]] = defaultdict(list)
    options = f"-c synchronous_commit={synchronous_commit}"
    with psycopg.connect(url, options=options) as pg:
        sync = sync_variants(pg, mod)

        async def async_run(run_index: int) -> dict[str, float]:
            apg_conn = await asyncpg.connect(url, server_settings={"synchronous_commit": synchronous_commit})
            apsy = await psycopg.AsyncConnection.connect(url, options=options)
            try:
                variants = async_variants(apsy, apg_conn, mod)
                for i, txn in enumerate(variants.values()):
                    for item in _items(WARM_UP, f"aw{i}r{run_index}", mod.sample_payload, mod.Message):
                        await txn(item)
                work = {
                    name: _items(count, f"a{i}r{run_index}", mod.sample_payload, mod.Message)
                    for i, name in enumerate(variants)
                }
                backends = {"psycopg": apsy.info.backend_pid, "asyncpg": apg_conn.get_server_pid()}
                pids = {name: backends[name.split(" ")[0].rstrip(":")] for name in variants}
                return await _async_blocks(variants, work, count, 1000 + run_index, pids)
            finally:
                await apsy.close()
                await apg_conn.close()

        for run_index in range(runs):
            _reset(url, mod)
            for i, txn in enumerate(sync.values()):
                for item in _items(WARM_UP, f"w{i}r{run_index}", mod.sample_payload, mod.Message):
                    txn(item)
            work = {
                name: _items(count, f"s{i}r{run_index}", mod.sample_payload, mod.Message) for i, name in enumerate(sync)
            }
            figures = _blocks(sync, work, count, run_index, dict.fromkeys(sync, pg.info.backend_pid))
            _reset(url, mod)
            figures.update(asyncio.run(async_run(run_index)))
            for name, value in figures.items():
                per_run[name].append(value)
            print(
                f"run {run_index + 1}/{runs}: "
                + ", ".join(
                    f"{name.split(':')[0][:24]} {value:.0f}" for name, value in figures.items() if "|" not in name
                ),
                file=sys.stderr,
                flush=True,
            )
    return per_run


def _ratio(per_run: dict[str, list[float]], ours: str, reference: str) -> str:
    ratios = [ref / our for our, ref in zip(per_run[ours], per_run[reference], strict=True)]
    return f"{statistics.median(ratios):.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"


# The server's share alone: one DO block per shape, each iteration the business row, the outbox row and a COMMIT
# (synchronous_commit off, no client in between): what the table, its triggers and the clauses cost the server.
SERVER_ROW = '\'{"order_id": "ord-\' || i || \'", "amount_cents": \' || i || \', "currency": "EUR"}\''


def _server_insert(table: str, clauses: str = "") -> str:
    columns, sha = (
        ("payload, headers", "") if table == "user_outbox" else ("payload, payload_sha, headers", "md5(i::text), ")
    )
    return (
        f"INSERT INTO {table} (event_id, topic, {columns}) "
        f"VALUES (tag || i, 'order.created', ({SERVER_ROW})::jsonb, {sha}'{{}}'::jsonb){clauses}"
    )


SERVER_SHAPES = {
    "user_outbox (b's table)": _server_insert("user_outbox"),
    "outbox columns, only the id and event_id keys": _server_insert("outbox_keys"),
    "+ the relay's and the on-call's partial indexes, no trigger": _server_insert("outbox_bare"),
    "+ payload-limit trigger": _server_insert("outbox_limit"),
    "+ NOTIFY trigger (the outbox table)": _server_insert("outbox_events"),
    "+ ON CONFLICT … RETURNING id (the enqueue's clauses)": _server_insert(
        "outbox_events", " ON CONFLICT (event_id) DO NOTHING RETURNING id INTO kept"
    ),
}
# The outbox columns and indexes with only the payload-limit and NOTIFY triggers: as 0020 and 0001 wrote them, and as
# the tree's migrations do (0023 on). Each run times them TRIGGER_TURNS times each, alternating.
TRIGGER_SHAPES = {
    "payload-limit and NOTIFY triggers of 0020/0001 (before 0023)": _server_insert("triggers_then"),
    "the same triggers as this tree's migrations write them": _server_insert("triggers_now"),
}
TRIGGER_TURNS = 3


def server_share(url: str, mod: Any, runs: int, count: int) -> dict[str, list[float]]:
    """µs per transaction inside the server, per shape; the shapes in a shuffled order per run."""
    import psycopg

    per_run: dict[str, list[float]] = defaultdict(list)
    shapes = {**SERVER_SHAPES, **TRIGGER_SHAPES}
    for run_index in range(runs):
        _reset(url, mod)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            order = random.Random(run_index).sample(list(SERVER_SHAPES), len(SERVER_SHAPES))
            then_now = list(TRIGGER_SHAPES)
            for turn in range(TRIGGER_TURNS):
                order += then_now if (run_index + turn) % 2 else then_now[::-1]
            wall, server = defaultdict(float), defaultdict(float)
            for number, name in enumerate(order):
                body = (
                    f"DO $$ DECLARE kept bigint; tag text := 'srv{run_index}-{number}-'; BEGIN "
                    f"FOR i IN 1..{count} LOOP INSERT INTO orders_biz (body) VALUES ('{{}}'); "
                    f"{shapes[name]}; COMMIT; END LOOP; END $$"
                )
                t0, s0 = time.perf_counter(), _server_ns(conn.info.backend_pid)
                conn.execute(body.encode())  # constant text: no input goes into it
                wall[name] += time.perf_counter() - t0
                server[name] += _server_ns(conn.info.backend_pid) - s0
            for name in shapes:
                turns = order.count(name) * count
                per_run[name].append(wall[name] / turns * 1e6)
                per_run[f"{name}|server"].append(server[name] / turns / 1e3)
    return per_run


def report_server(per_run: dict[str, list[float]]) -> None:
    print(
        "\n| inside the server (DO block: business row, outbox row, COMMIT) | µs per transaction "
        "| over the line above |"
    )
    print("|---|---|---|")
    previous = None
    for name in SERVER_SHAPES:
        values = per_run[name]
        step = (
            "–"
            if previous is None
            else f"{statistics.median([v - p for v, p in zip(values, previous, strict=True)]):+.1f}"
        )
        print(f"| {name} | {statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}] | {step} |")
        previous = values
    print("\n| the two insert triggers, same runs | µs per transaction | server CPU µs | against the first line |")
    print("|---|---|---|---|")
    first = list(TRIGGER_SHAPES)[0]
    for name in TRIGGER_SHAPES:
        cpu, cpu_first = per_run[f"{name}|server"], per_run[f"{first}|server"]
        steps = [v - f for v, f in zip(cpu, cpu_first, strict=True)]
        print(
            f"| {name} | {statistics.median(per_run[name]):.1f} | {statistics.median(cpu):.2f} "
            f"| {statistics.median(steps):+.2f} [{min(steps):+.2f}–{max(steps):+.2f}] |"
        )


def _median(per_run: dict[str, list[float]], name: str) -> float:
    return statistics.median(per_run[name])


def _step(per_run: dict[str, list[float]], name: str, previous: str | None) -> str:
    """The median, over runs, of this line's figure less the previous line's."""
    if previous is None:
        return f"{_median(per_run, name):.0f}"
    steps = [v - p for v, p in zip(per_run[name], per_run[previous], strict=True)]
    return f"{_median(per_run, name):.0f} ({statistics.median(steps):+.1f})"


def report(per_run: dict[str, list[float]]) -> None:
    base = per_run[SYNC_VARIANTS[0]]
    print(
        "\n| sync psycopg, one cursor (the last line: on the connection) | µs per transaction | throughput / (b) "
        "| client CPU µs (step) | server CPU µs (step) |"
    )
    print("|---|---|---|---|---|")
    previous: str | None = None
    for name in SYNC_VARIANTS:
        before = SYNC_VARIANTS[-2] if name == SYNC_VARIANTS[-1] else previous
        ratios = [b / v for v, b in zip(per_run[name], base, strict=True)]
        print(
            f"| {name} | {_median(per_run, name):.0f} | {statistics.median(ratios):.2f}× "
            f"| {_step(per_run, name + '|cpu', before and before + '|cpu')} "
            f"| {_step(per_run, name + '|server', before and before + '|server')} |"
        )
        previous = name
    print(
        "\n| ours | µs: ours (b, c) | throughput against (b) | against (c) | client CPU µs: ours, b, c | server CPU |"
    )
    print("|---|---|---|---|---|---|")
    pairs = (
        (SYNC_VARIANTS[7], SYNC_VARIANTS[0], SYNC_VARIANTS[3]),
        (SYNC_VARIANTS[8], SYNC_VARIANTS[0], SYNC_VARIANTS[3]),
        (ASYNC_VARIANTS[2], ASYNC_VARIANTS[0], ASYNC_VARIANTS[1]),
        (ASYNC_VARIANTS[5], ASYNC_VARIANTS[3], ASYNC_VARIANTS[4]),
    )
    for ours, user, reference in pairs:
        trio = (ours, user, reference)
        print(
            f"| {ours} | {_median(per_run, ours):.0f} ("
            + ", ".join(f"{_median(per_run, name):.0f}" for name in trio[1:])
            + f") | {_ratio(per_run, ours, user)} | {_ratio(per_run, ours, reference)} | "
            + ", ".join(f"{_median(per_run, name + '|cpu'):.0f}" for name in trio)
            + " | "
            + ", ".join(f"{_median(per_run, name + '|server'):.0f}" for name in trio)
            + " |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    parser.add_argument("--transactions", type=int, default=1000, help="transactions per variant and run")
    parser.add_argument("--tree", help="import outbox_pipelines (and sql/) from this copy of the tree")
    parser.add_argument("--synchronous-commit", default="on", choices=("on", "off"))
    parser.add_argument("--skip-server", action="store_true", help="leave out the in-server probe")
    args = parser.parse_args(argv)
    mod = _modules(args.tree)
    print(f"outbox_pipelines from {mod.where}; load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    server = mod.BenchServer()
    try:
        _, url = server.create_database("enqueue_vs_insert")
        _setup(url)
        inside = server_share(url, mod, args.runs, args.transactions) if not args.skip_server else {}
        per_run = run(url, mod, args.runs, args.transactions, args.synchronous_commit)
    finally:
        server.close()
    print(
        f"\n{args.runs} runs of {args.transactions:,} transactions a variant, synchronous_commit "
        f"{args.synchronous_commit}, tree {mod.where}, load average at end {os.getloadavg()[0]:.2f}"
    )
    report(per_run)
    if inside:
        report_server(inside)


if __name__ == "__main__":
    main()
