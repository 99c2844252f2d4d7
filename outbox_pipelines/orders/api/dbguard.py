"""The Order API's database under stress: time budgets, busy/unavailable answers, a health probe.

One budget per request, ``OUTBOX_API_DB_TIMEOUT`` (2 s), pool wait included; past it 503 ``DATABASE_BUSY``
with ``Retry-After``. ``/healthz`` answers within ``HEALTH_BUDGET_S`` on a connection of its own.
Why: docs/explanation/orders.md, "The Order API under a busy database".
"""

import asyncio
import concurrent.futures
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
import sqlalchemy as sa

from outbox_pipelines.core.storage import db, network_limits

HEALTH_BUDGET_S = 0.8  # what /healthz waits for the probe: under 1 s with the HTTP round trip
HEALTH_STATEMENT_TIMEOUT_MS = 500
HEALTH_POOL_TIMEOUT_S = 0.5
STATEMENT_GRACE_MS = 100  # statement_timeout = lock_timeout + this
MIN_CONNECT_TIMEOUT_S = 2  # libpq and psycopg read anything lower as 2 s


class DatabaseTrouble(Exception):
    """Why the database could not serve a request: ``code`` DATABASE_BUSY or DATABASE_UNAVAILABLE.

    ``reason`` is a short category for logs and metrics (never a message from the
    driver, which may carry SQL, parameters or where the server is)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code} ({reason})")
        self.code, self.reason = code, reason

    @property
    def busy(self) -> bool:
        return self.code == "DATABASE_BUSY"


BUSY_ERRORS: dict[type[BaseException], str] = {
    psycopg.errors.LockNotAvailable: "lock_timeout",
    psycopg.errors.QueryCanceled: "statement_timeout",
    psycopg.errors.DeadlockDetected: "deadlock",
    psycopg.errors.SerializationFailure: "serialization_failure",
    psycopg.errors.TooManyConnections: "too_many_connections",
}
UNAVAILABLE_ERRORS: dict[type[BaseException], str] = {
    psycopg.errors.ConnectionTimeout: "connect_timeout",  # connect_timeout passed: no answer from the server
}


def classify(exc: BaseException) -> DatabaseTrouble | None:
    """DATABASE_BUSY for a timeout (lock, statement, pool), DATABASE_UNAVAILABLE for a connection
    that fails or breaks; None for anything else (a bug: 500)."""
    if isinstance(exc, DatabaseTrouble):
        return exc
    if isinstance(exc, sa.exc.TimeoutError):  # QueuePool: no connection within pool_timeout
        return DatabaseTrouble("DATABASE_BUSY", "pool_timeout")
    original = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    for kind, reason in BUSY_ERRORS.items():
        if isinstance(original, kind):
            return DatabaseTrouble("DATABASE_BUSY", reason)
    for kind, reason in UNAVAILABLE_ERRORS.items():
        if isinstance(original, kind):
            return DatabaseTrouble("DATABASE_UNAVAILABLE", reason)
    if isinstance(original, (psycopg.OperationalError, psycopg.InterfaceError)):
        # Cannot connect, server shut down or starting up, connection lost mid-transaction.
        return DatabaseTrouble("DATABASE_UNAVAILABLE", "connection_error")
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    ):
        return DatabaseTrouble("DATABASE_UNAVAILABLE", "connection_error")
    return None


def connect_timeout_s(url: str, wanted_s: float) -> int | None:
    """The connect_timeout to add to the connection arguments; None when the URL sets its own."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(db.psycopg_url(url))
    except psycopg.ProgrammingError:
        return None
    if info.get("connect_timeout"):
        return None
    return max(MIN_CONNECT_TIMEOUT_S, math.ceil(wanted_s))


def with_session_timeouts(url: str, timeout_ms: int) -> str:
    """``url`` as a conninfo whose sessions carry statement and lock timeouts (and a connect timeout),
    keeping any ``options`` the URL already had."""
    try:
        info = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(db.psycopg_url(url)).items() if v is not None}
    except psycopg.ProgrammingError:
        return url  # connecting will say what is wrong with it
    ours = f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}"
    info["options"] = f"{info['options']} {ours}" if info.get("options") else ours
    info.setdefault("connect_timeout", str(max(MIN_CONNECT_TIMEOUT_S, math.ceil(timeout_ms / 1000))))
    return psycopg.conninfo.make_conninfo("", **info)


class Budget:
    """One request's database time: a deadline that the pool wait and the transaction share."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


class GuardedEngine:
    """The request pool: a gate in front of the engine bounds the wait for a connection by the
    request's budget (SQLAlchemy's pool_timeout is one number for every checkout), and each
    transaction gets what is left of the budget as its statement and lock timeouts."""

    def __init__(self, url: str, *, pool_size: int, max_overflow: int, pool_timeout_s: float, timeout_s: float) -> None:
        self.timeout_s, self.pool_timeout_s = timeout_s, pool_timeout_s
        connect_args: dict[str, Any] = network_limits.params(url)  # keepalives, a TCP user timeout
        connect = connect_timeout_s(url, timeout_s)
        if connect is not None:
            connect_args["connect_timeout"] = connect
        self.engine = sa.create_engine(
            db.sqlalchemy_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=pool_timeout_s,
            pool_pre_ping=True,
            connect_args=connect_args,
            hide_parameters=True,
        )  # orders never reach a log, whatever its level
        self._gate = threading.BoundedSemaphore(pool_size + max_overflow)

    def budget(self) -> Budget:
        return Budget(self.timeout_s)

    @contextmanager
    def transaction(self, budget: Budget) -> Iterator[psycopg.Connection]:
        """A psycopg connection in a transaction bounded by ``budget``; DatabaseTrouble when the
        database is busy or away (the transaction rolled back)."""
        wait = min(self.pool_timeout_s, budget.remaining())
        if wait <= 0 or not self._gate.acquire(timeout=wait):
            raise DatabaseTrouble("DATABASE_BUSY", "pool_timeout")
        try:
            with self.engine.begin() as conn:
                pg = conn.connection.driver_connection
                assert isinstance(pg, psycopg.Connection)
                left_ms = int(budget.remaining() * 1000)
                if left_ms < 10:
                    raise DatabaseTrouble("DATABASE_BUSY", "pool_timeout")
                # A wait for a lock reports itself as such: the statement timeout is the backstop, a
                # little later, for a statement that is slow without waiting for anyone.
                pg.execute(
                    "SELECT set_config('lock_timeout', %(lock)s, true), "
                    "set_config('statement_timeout', %(stmt)s, true)",
                    {"lock": str(left_ms), "stmt": str(left_ms + STATEMENT_GRACE_MS)},
                )
                yield pg
        except DatabaseTrouble:
            raise
        except Exception as exc:
            trouble = classify(exc)
            if trouble is None:
                raise
            raise trouble from None
        finally:
            self._gate.release()

    def dispose(self) -> None:
        self.engine.dispose()


@dataclass(frozen=True)
class Health:
    database: str  # ok | timeout | unreachable

    @property
    def ok(self) -> bool:
        return self.database == "ok"


class HealthProbe:
    """``SELECT 1`` on a connection of its own, one probe at a time, answered within the budget.

    Callers arriving while a probe runs share it; a probe that outlives the budget
    (a connect that hangs, a server that does not answer) is reported as ``timeout``
    and keeps going in the background, bounded by its connect and statement timeouts."""

    def __init__(self, url: str, budget_s: float = HEALTH_BUDGET_S) -> None:
        self.budget_s = budget_s
        connect_args: dict[str, Any] = network_limits.params(url)  # keepalives, a TCP user timeout
        connect = connect_timeout_s(url, 1)
        if connect is not None:
            connect_args["connect_timeout"] = connect
        self.engine = sa.create_engine(
            db.sqlalchemy_url(url),
            pool_size=1,
            max_overflow=0,
            pool_timeout=HEALTH_POOL_TIMEOUT_S,
            pool_pre_ping=False,
            connect_args=connect_args,
            hide_parameters=True,
        )
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="order-api-healthz")
        self._lock = threading.Lock()
        self._inflight: concurrent.futures.Future[Health] | None = None

    def _ping(self) -> Health:
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = {HEALTH_STATEMENT_TIMEOUT_MS}")
                conn.exec_driver_sql("SELECT 1")
        except Exception as exc:  # classified below; the probe reports, never raises
            trouble = classify(exc)
            timed_out = trouble is not None and (trouble.busy or trouble.reason.endswith("timeout"))
            return Health("timeout" if timed_out else "unreachable")
        return Health("ok")

    def _probe(self) -> "concurrent.futures.Future[Health]":
        with self._lock:
            if self._inflight is None or self._inflight.done():
                self._inflight = self._executor.submit(self._ping)
            return self._inflight

    async def check(self) -> Health:
        probe = asyncio.wrap_future(self._probe())
        try:
            return await asyncio.wait_for(asyncio.shield(probe), self.budget_s)
        except TimeoutError:
            return Health("timeout")

    def dispose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()
