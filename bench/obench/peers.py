"""peers: our relay and enqueue set against what else a team could use instead.

Two kinds of peer, measured in the same run and on the same server as ours:

- "the simplest loop a person would write": a psycopg 3 loop that claims pending
  rows of our outbox table with ``FOR UPDATE SKIP LOCKED``, calls a no-op handler
  and marks them sent, with no audit, lease, attempts or error handling. It is
  the floor a team compares a library against ("why not just write the loop?");
- pgqueuer 1.6 (a published PostgreSQL job queue for Python), driven only
  through its public API (``PgQueuer``, ``Queries``/``SyncQueries``,
  ``PsycopgDriver``/``SyncPsycopgDriver``) with its DEFAULT settings, so the
  figure is what a team gets by installing it and following its README.

Plus two plain-psycopg batch-enqueue references (``executemany`` and ``COPY``)
taking the same input our ``Outbox.enqueue_many`` takes.

Worker functions follow common.run_processes: ``func(*args, barrier)`` in a
spawned process, ``barrier()`` once set-up is done, then the timed work, and
``(started_monotonic, finished_monotonic, count)`` back.

pgqueuer's defaults, read from its 1.6.0 source (``PgQueuer.run`` /
``QueueManager.run`` in pgqueuer/core/qm.py and core/applications.py, buffers in
core/buffers.py, schema in domain/settings.py and domain/schema/notify.py):

- ``batch_size=10``: each dequeue claims up to 10 jobs (one UPDATE ... FROM
  (SELECT ... ORDER BY priority DESC, id FOR UPDATE SKIP LOCKED LIMIT 10) that
  also INSERTs a 'picked' row per job into ``pgqueuer_log``);
- ``max_concurrent_tasks=None`` (unlimited) and per-entrypoint
  ``concurrency_limit=0`` (unlimited): every claimed job becomes an asyncio task
  at once, and the worker keeps dequeuing batches while they return rows;
- completion: a ``JobStatusLogBuffer`` with ``max_size=batch_size`` (10) and a
  0.1 s flush timeout; a flush is one statement that DELETEs the finished jobs
  from ``pgqueuer`` and INSERTs a 'successful' row each into ``pgqueuer_log``;
- heartbeat per job every ``heartbeat_timeout/2`` = 15 s (buffered, flushed every
  30/8 s or at 100 entries), stale after ``heartbeat_timeout`` = 30 s;
- wake-up: a statement-level trigger on ``pgqueuer`` sends ``pg_notify`` on the
  channel ``ch_pgqueuer`` for every INSERT/UPDATE/DELETE/TRUNCATE; when a
  dequeue comes back empty the worker waits for a notification or
  ``dequeue_timeout`` = 30 s (0.1 s re-poll when work is still eligible);
- background: a LISTEN/NOTIFY health probe every 10 s, log -> statistics
  aggregation every 30 s (±20 %), and (with ``PgQueuer``) a SchedulerManager
  polling ``pgqueuer_schedules`` about once a second;
- ``mode=continuous`` (the worker never stops by itself); ``durability=durable``
  (all tables logged); ``on_failure='delete'``.

With the psycopg driver (asyncpg, pgqueuer's other driver, is not installed here)
one AsyncConnection carries the queries and the LISTEN; its notification watcher
holds the connection's lock for up to 1 s at a time while no notification comes,
so an idle worker's queries can wait behind it. That is part of what is measured.
"""

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from obench.common import (
    DEADLINE_FACTOR,
    DEADLINE_SLACK_S,
    PRODUCER_HEAD_START_S,
    Barrier,
    latency_summary,
    run_processes,
    sample_payload,
)

# -- the simplest loop ---------------------------------------------------------

SIMPLE_CLAIM = (
    "SELECT id, event_id, topic, payload, headers FROM {} "
    "WHERE status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)
SIMPLE_SETTLE = "UPDATE {} SET status = 'sent', published_at = now(), updated_at = now() WHERE id = ANY(%s)"
# The index a person writing that loop creates for its claim. Our table's own pending index also says
# NOT ordering_blocked (migration 0010), which SIMPLE_CLAIM's WHERE does not imply: without this index the
# simple loop walks the primary key past every row it already sent (10,761 msg/s instead of about 40,000).
SIMPLE_INDEX = "CREATE INDEX IF NOT EXISTS simple_loop_pending ON {} (id) WHERE status = 'pending'"
SIMPLE_INDEX_DROP = "DROP INDEX IF EXISTS simple_loop_pending"


@contextmanager
def simple_loop_index(url: str, table_name: str) -> Iterator[None]:
    """The simple loop's own index while it runs; dropped after, so ours never maintains it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(SIMPLE_INDEX).format(sql.Identifier(table_name)))
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table_name)))
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SIMPLE_INDEX_DROP)


def _noop_handler(row: tuple[Any, ...]) -> None:
    """The handler of the simple loop: does nothing, so the loop's own cost is all that is measured."""


def simple_drain(
    conn: psycopg.Connection, table_name: str, batch: int, handler: Callable[[tuple[Any, ...]], None] = _noop_handler
) -> int:
    """Claim, handle and mark sent one batch per transaction until a claim comes back empty.

    This is the loop most people write first: one transaction holds the row
    locks while the handler runs, so a crash rolls the batch back to pending.
    No lease, attempts, audit or per-message outcome, which is exactly the work
    our relay does and this loop does not. The payload and headers come back as
    Python objects (psycopg parses jsonb), as any handler would need them.
    """
    claim = sql.SQL(SIMPLE_CLAIM).format(sql.Identifier(table_name))
    settle = sql.SQL(SIMPLE_SETTLE).format(sql.Identifier(table_name))
    sent = 0
    with conn.cursor() as cur:
        while True:
            cur.execute(claim, (batch,))
            rows = cur.fetchall()
            if not rows:
                conn.commit()
                return sent
            for row in rows:
                handler(row)
            cur.execute(settle, ([row[0] for row in rows],))
            conn.commit()
            sent += len(rows)


def simple_drain_worker(
    url: str, table_name: str, batch: int, index: int, barrier: Barrier
) -> tuple[float, float, int]:
    """One process of the simple loop; connecting is inside the clock, as for ours and the ceiling."""
    barrier()
    started = time.monotonic()
    with psycopg.connect(url, autocommit=False, application_name=f"bench-simple-{index}") as conn:
        sent = simple_drain(conn, table_name, batch)
    return started, time.monotonic(), sent


# -- batch enqueue references (plain psycopg) ----------------------------------

# What our Outbox.enqueue_many takes, spelled as plain data: (event_id, topic, payload, headers).
EnqueueItem = tuple[str, str, dict[str, Any], dict[str, Any]]

PLAIN_COLUMNS = "(event_id, topic, payload, payload_sha, headers)"


def _plain_row(item: EnqueueItem) -> tuple[str, str, str, str, str]:
    """json.dumps the payload and headers, as a person would, and hash the payload text.

    payload_sha is NOT NULL in our outbox table, so anyone writing rows by hand
    has to fill it; the plain sha256 hex of the JSON text is the obvious choice
    (ours stores "sha256:<hex>" of canonical JSON, a few bytes more; same cost).
    """
    event_id, topic, payload, headers = item
    text = json.dumps(payload)
    return event_id, topic, text, hashlib.sha256(text.encode()).hexdigest(), json.dumps(headers)


def executemany_insert(conn: psycopg.Connection, table_name: str, items: Sequence[EnqueueItem]) -> int:
    """INSERT the items with cursor.executemany; the caller commits (and times commit with it).

    psycopg 3 runs executemany in pipeline mode (one round trip for the lot,
    one INSERT execution per row), which is what a person gets without trying.
    Serialisation happens here, inside the caller's clock, as it does in ours.
    """
    statement = sql.SQL(
        "INSERT INTO {} (event_id, topic, payload, payload_sha, headers) VALUES (%s, %s, %s::jsonb, %s, %s::jsonb)"
    ).format(sql.Identifier(table_name))
    rows = [_plain_row(item) for item in items]
    with conn.cursor() as cur:
        cur.executemany(statement, rows)
    return len(rows)


def bare_copy(conn: psycopg.Connection, table_name: str, items: Sequence[EnqueueItem]) -> int:
    """COPY the items with cursor.copy/write_row; the caller commits.

    The fastest insert PostgreSQL has; the same columns and serialisation as
    executemany_insert, so the two references differ only in the protocol.
    """
    statement = sql.SQL("COPY {} (event_id, topic, payload, payload_sha, headers) FROM STDIN").format(
        sql.Identifier(table_name)
    )
    count = 0
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for item in items:
            copy.write_row(_plain_row(item))
            count += 1
    return count


# -- pgqueuer ------------------------------------------------------------------

PGQ_ENTRYPOINT = "noop"
# pgqueuer's default object names (DBSettings, with PGQUEUER_PREFIX and PGQUEUER_SCHEMA unset);
# pgqueuer_install checks that the installed settings agree, since the helpers below read these tables.
PGQ_QUEUE_TABLE = "pgqueuer"
PGQ_LOG_TABLE = "pgqueuer_log"
PGQ_STATISTICS_TABLE = "pgqueuer_statistics"
PGQ_LOAD_BATCH = 1_000
# How often a drain worker looks whether the queue is empty: the end of a run is
# known to within this, and each look is one cheap query on its own connection.
PGQ_EMPTY_POLL_S = 0.05
# A drain worker gives up after this long (a stuck run, not a slow one: the parent's own timeout is longer).
PGQ_DRAIN_DEADLINE_S = 900.0


def _pgq_payload(n: int) -> bytes:
    """Job n's payload: the same order-like document our rows carry, as JSON bytes."""
    return json.dumps(sample_payload(n)).encode()


async def _pgq_call(url: str, action: Callable[[Any], Any]) -> Any:
    """Run ``await action(queries)`` on a pgqueuer Queries over a fresh autocommit AsyncConnection."""
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await action(Queries(PsycopgDriver(conn)))


def pgqueuer_install(url: str, fresh: bool = False) -> bool:
    """Install pgqueuer's schema with its public Queries.install(); True if it was (re)installed.

    Idempotent: an installed schema is left alone, unless ``fresh`` asks for
    Queries.uninstall() then install() (its tables, enum, trigger and function).
    """
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "pgqueuer, the benchmark's peer, is not installed: .venv/bin/pip install -e '.[bench]'"
        ) from None

    async def install(queries: Any) -> bool:
        settings = queries.qbe.settings
        names = (settings.queue_table, settings.queue_table_log, settings.statistics_table)
        if names != (PGQ_QUEUE_TABLE, PGQ_LOG_TABLE, PGQ_STATISTICS_TABLE) or settings.db_schema is not None:
            raise RuntimeError(f"pgqueuer is configured with other table names {names} (PGQUEUER_* env?)")
        if await queries.schema_is_installed():
            if not fresh:
                return False
            await queries.uninstall()
        await queries.install()
        return True

    return bool(asyncio.run(_pgq_call(url, install)))


def pgqueuer_reset(url: str) -> None:
    """Empty pgqueuer's queue, log and statistics tables (its clear_* API: TRUNCATE each)."""

    async def reset(queries: Any) -> None:
        await queries.clear_queue()
        await queries.clear_queue_log()
        await queries.clear_statistics_log()

    asyncio.run(_pgq_call(url, reset))


def pgqueuer_settle(url: str) -> None:
    """VACUUM ANALYZE pgqueuer's tables, then CHECKPOINT: the same start as settle_server gives ours."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table_name in (PGQ_QUEUE_TABLE, PGQ_LOG_TABLE, PGQ_STATISTICS_TABLE):
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table_name)))
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass


def _sync_queries(conn: psycopg.Connection) -> Any:
    """pgqueuer's synchronous enqueue API over a psycopg Connection (which must be autocommit)."""
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    return SyncQueries(SyncPsycopgDriver(conn))


def pgqueuer_load(url: str, count: int, start: int = 0) -> int:
    """Enqueue ``count`` 'noop' jobs (payloads ``sample_payload(start..)``), 1,000 per enqueue call.

    Outside any clock: this only fills the queue for a drain.
    """
    loaded = 0
    with psycopg.connect(url, autocommit=True) as conn:
        queries = _sync_queries(conn)
        for first in range(start, start + count, PGQ_LOAD_BATCH):
            last = min(first + PGQ_LOAD_BATCH, start + count)
            n = last - first
            ids = queries.enqueue([PGQ_ENTRYPOINT] * n, [_pgq_payload(i) for i in range(first, last)], [0] * n)
            loaded += len(ids)
    return loaded


def pgqueuer_enqueue_batch(conn_or_queries: psycopg.Connection | Any, payloads: Sequence[Any]) -> list[int]:
    """One call of pgqueuer's batch enqueue for all ``payloads`` (list form of SyncQueries.enqueue).

    What it does, read from its source: one statement, ``WITH input AS
    MATERIALIZED (SELECT nextval(...), ... FROM UNNEST($1::int[], $2::text[],
    $3::bytea[], ...)) INSERT INTO pgqueuer ... RETURNING`` plus an INSERT of a
    'queued' row per job into pgqueuer_log, and the statement trigger's one
    NOTIFY. Its driver demands an autocommit connection, so outside an explicit
    ``conn.transaction()`` block the call is its own committed transaction when
    it returns; inside one it joins the caller's transaction (which is how a
    pgqueuer user gets a transactional enqueue with psycopg).

    ``payloads`` are dicts (json.dumps'ed here, inside the caller's clock, as
    ours and the plain references do) or ready bytes. ``conn_or_queries`` is an
    autocommit psycopg Connection or a SyncQueries built on one.
    """
    queries = _sync_queries(conn_or_queries) if isinstance(conn_or_queries, psycopg.Connection) else conn_or_queries
    data = [p if isinstance(p, (bytes, type(None))) else json.dumps(p).encode() for p in payloads]
    n = len(data)
    return [int(i) for i in queries.enqueue([PGQ_ENTRYPOINT] * n, data, [0] * n)]


def pgqueuer_counts(url: str) -> dict[str, Any]:
    """What is left in pgqueuer's queue and what its log says happened (for checking a run)."""
    with psycopg.connect(url, autocommit=True) as conn:
        queue = conn.execute(
            sql.SQL("SELECT status::text, count(*) FROM {} GROUP BY 1").format(sql.Identifier(PGQ_QUEUE_TABLE))
        ).fetchall()
        log_rows = conn.execute(
            sql.SQL("SELECT status::text, count(*) FROM {} GROUP BY 1").format(sql.Identifier(PGQ_LOG_TABLE))
        ).fetchall()
    return {
        "queue": {status: int(n) for status, n in queue},
        "queue_total": sum(int(n) for _, n in queue),
        "log": {status: int(n) for status, n in log_rows},
    }


async def _queue_is_empty(probe: psycopg.AsyncConnection) -> bool:
    """One look at the queue table: finished jobs are deleted from it, so empty means all done."""
    cur = await probe.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(PGQ_QUEUE_TABLE)))
    row = await cur.fetchone()
    return bool(row and row[0])


async def _stop_pgqueuer(pgq: Any, runner: "asyncio.Task[None]") -> None:
    """Stop a PgQueuer through its public shutdown event and wait for run() to return.

    run() then leaves its loops, flushes its log and heartbeat buffers and stops
    listening; an error it raised surfaces here.
    """
    pgq.shutdown.set()
    await runner


async def _pgqueuer_drain(
    url: str, expected_total: int, index: int, barrier: Barrier, batch_size: int | None
) -> tuple[float, float, int]:
    from pgqueuer import PgQueuer, PsycopgDriver
    from pgqueuer.models import Job

    done = 0

    async def noop(job: Job) -> None:
        nonlocal done
        done += 1

    # The probe is the benchmark's instrument, not pgqueuer's: it connects before the clock.
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as probe:
        barrier()
        started = time.monotonic()
        # Connecting is inside the clock, as it is inside Relay.run for ours and for the simple loop.
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, application_name=f"bench-pgqueuer-{index}"
        ) as conn:
            pgq = PgQueuer(PsycopgDriver(conn))
            pgq.entrypoint(PGQ_ENTRYPOINT)(noop)  # defaults: concurrency_limit=0, on_failure='delete'
            # Every run() argument at its default (see the module doc), but batch_size when one is given.
            runner = asyncio.create_task(pgq.run() if batch_size is None else pgq.run(batch_size=batch_size))
            deadline = started + PGQ_DRAIN_DEADLINE_S
            try:
                while True:
                    if runner.done():
                        runner.result()  # raises what stopped it
                        raise RuntimeError("pgqueuer's run() returned before the queue was empty")
                    if await _queue_is_empty(probe):
                        finished = time.monotonic()
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"pgqueuer worker {index}: queue not empty after {PGQ_DRAIN_DEADLINE_S:.0f} s "
                            f"({done} handled here, {expected_total} expected in all)"
                        )
                    await asyncio.sleep(PGQ_EMPTY_POLL_S)
            finally:
                await _stop_pgqueuer(pgq, runner)
    return started, finished, done


def pgqueuer_drain_worker(
    url: str, expected_total: int, index: int, batch_size: int | None, barrier: Barrier
) -> tuple[float, float, int]:
    """One pgqueuer worker process (PgQueuer, defaults) draining the queue; (started, finished, jobs it ran).

    The worker stops when the queue table is empty: pgqueuer deletes a job from
    it (and logs it 'successful' in pgqueuer_log) in one statement once the
    handler returned, so an empty table means every job of every worker is
    done and recorded. Each worker notes the time it saw the table empty, so the
    caller's max(finished) - min(started) is the drain, to within 50 ms of polling.
    ``expected_total`` (all workers together) only labels a stuck run; the caller
    checks the totals (sum of the counts, pgqueuer_counts()).
    """
    return asyncio.run(_pgqueuer_drain(url, expected_total, index, barrier, batch_size))


def pgqueuer_drain_once(url: str, workers: int, count: int, batch_size: int | None = None) -> float:
    """Load ``count`` jobs, drain them with ``workers`` processes; return jobs per second (checked).
    ``batch_size``: pgqueuer's run(batch_size=...) (None: its default, 10)."""
    pgqueuer_reset(url)
    pgqueuer_load(url, count)
    pgqueuer_settle(url)
    jobs = [(pgqueuer_drain_worker, (url, count, i, batch_size)) for i in range(workers)]
    results = run_processes(jobs, timeout_s=1200)
    started: float = min(r[0] for r in results)
    finished: float = max(r[1] for r in results)
    done: int = sum(r[2] for r in results)
    counts = pgqueuer_counts(url)
    if done != count or counts["queue_total"] != 0 or counts["log"].get("successful", 0) != count:
        raise RuntimeError(f"pgqueuer drain x{workers}: {done} handled, state {counts}, expected {count}")
    return done / (finished - started)


# -- pgqueuer latency (commit -> handler), same pattern as obench.latency ------


def _latency_key(n: int) -> str:
    """The key both sides agree on: the payload's order_id."""
    return str(sample_payload(n)["order_id"])


def pgqueuer_latency_producer(url: str, rate: float, seconds: float, barrier: Barrier) -> tuple[str, dict[str, float]]:
    """Enqueue one job per transaction on a fixed schedule; the time after each commit, by order_id.

    pgqueuer's enqueue on an autocommit connection is its own transaction, so
    the clock is read right after the call returns (the commit has happened).
    """
    count = int(rate * seconds)
    payloads = [_pgq_payload(n) for n in range(count)]
    keys = [_latency_key(n) for n in range(count)]
    committed: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        queries = _sync_queries(conn)
        barrier()
        time.sleep(PRODUCER_HEAD_START_S)
        start = time.monotonic()
        for n in range(count):
            pause = start + n / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            queries.enqueue(PGQ_ENTRYPOINT, payloads[n], 0)
            committed[keys[n]] = time.monotonic()
    return "producer", committed


async def _pgqueuer_consume(
    url: str, expected: int, seconds: float, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    from pgqueuer import PgQueuer, PsycopgDriver
    from pgqueuer.models import Job

    delivered: dict[str, float] = {}
    all_in = asyncio.Event()

    async def noop(job: Job) -> None:
        now = time.monotonic()
        delivered[json.loads(job.payload or b"{}")["order_id"]] = now
        if len(delivered) >= expected:
            all_in.set()

    async with await psycopg.AsyncConnection.connect(url, autocommit=True, application_name="bench-pgq-lat") as conn:
        pgq = PgQueuer(PsycopgDriver(conn))
        pgq.entrypoint(PGQ_ENTRYPOINT)(noop)
        runner = asyncio.create_task(pgq.run())  # defaults, as in the drain
        # Let run() verify the schema and LISTEN while this process waits at the barrier.
        await asyncio.to_thread(barrier)
        try:
            waiter = asyncio.create_task(all_in.wait())
            done_set, _ = await asyncio.wait({waiter, runner}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if runner in done_set:
                runner.result()
                raise RuntimeError("pgqueuer's run() returned before every job was handled")
        finally:
            await _stop_pgqueuer(pgq, runner)
    return "consumer", delivered, {"sent": len(delivered)}


def pgqueuer_latency_consumer(
    url: str, rate: float, seconds: float, barrier: Barrier
) -> tuple[str, dict[str, float], dict[str, Any]]:
    """A PgQueuer (defaults) whose entrypoint notes when each job reaches it, by order_id.

    Stops once every job the producer will commit (rate x seconds) has been
    handled, or after a generous deadline that only ends a run that lost jobs.
    """
    expected = int(rate * seconds)
    deadline_s = PRODUCER_HEAD_START_S + seconds * DEADLINE_FACTOR + DEADLINE_SLACK_S
    return asyncio.run(_pgqueuer_consume(url, expected, deadline_s, barrier))


def pgqueuer_latency_measure(url: str, rate: float, seconds: float) -> dict[str, Any]:
    """One producer + one pgqueuer consumer; latency percentiles in ms (first WARM_UP_S left out)."""
    pgqueuer_reset(url)
    pgqueuer_settle(url)
    deadline_s = PRODUCER_HEAD_START_S + seconds * DEADLINE_FACTOR + DEADLINE_SLACK_S
    results = run_processes(
        [(pgqueuer_latency_consumer, (url, rate, seconds)), (pgqueuer_latency_producer, (url, rate, seconds))],
        timeout_s=deadline_s + 60,
    )
    committed = next(r[1] for r in results if r[0] == "producer")
    delivered, info = next((r[1], r[2]) for r in results if r[0] == "consumer")
    return {**latency_summary(committed, delivered, rate), **info}
