"""Small helpers shared by the tests."""

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow, dict_row

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome

DictConnection = psycopg.Connection[DictRow]


def order_payload(i: int, key: str | None = None) -> dict[str, Any]:
    """A valid OrderRequest v1.1 (outbox_orders rows are orders: the broker adapter maps them)."""
    return {"order_id": f"ord-{i}", "instrument": "USDJPY", "side": "BUY" if i % 2 else "SELL", "qty": 0.1,
            "price": None, "time_in_force": "IOC", "tags": [], "idempotency_key": key or f"key-{i}",
            "requested_at": "2026-01-01T00:00:00Z"}


def enqueue_n(conn: DictConnection, table_name: str, n: int, *, topic: str = "t", prefix: str = "e",
              payload: Callable[[int], dict[str, Any]] | None = None) -> list[int]:
    if payload is None and table_name == "outbox_orders":
        payload = order_payload
    messages = [
        Message(topic=topic, payload=payload(i) if callable(payload) else {"n": i}, event_id=f"{prefix}{i}")
        for i in range(n)
    ]
    return [r.id for r in Outbox(table_name).enqueue_many(conn, messages)]


def db_now(conn: DictConnection) -> datetime:
    row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def rows(conn: DictConnection, table_name: str, where: str = "true") -> list[dict[str, Any]]:
    # ``where`` is SQL the test writes (never input), the table name a quoted identifier.
    statement = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY id").format(sql.Identifier(table_name), sql.SQL(where))
    return conn.execute(statement).fetchall()


def statuses(conn: DictConnection, table_name: str) -> dict[str, int]:
    statement = sql.SQL("SELECT status, count(*) AS n FROM {} GROUP BY status").format(sql.Identifier(table_name))
    return {r["status"]: r["n"] for r in conn.execute(statement).fetchall()}


def audit_codes(conn: DictConnection, table_name: str, message_id: int | None = None) -> list[str]:
    if message_id is None:
        found = conn.execute("SELECT code FROM outbox_audit WHERE outbox_table = %s ORDER BY id", (table_name,))
    else:
        found = conn.execute(
            "SELECT code FROM outbox_audit WHERE outbox_table = %s AND message_id = %s ORDER BY id",
            (table_name, message_id),
        )
    return [r["code"] for r in found.fetchall()]


class ScriptedDestination(Destination):
    """A destination whose outcome is a function of the message (for relay tests)."""

    name = "scripted"

    def __init__(
        self, decide: Callable[[ClaimedMessage], Outcome] = lambda m: Outcome.sent(ref=f"ref-{m.id}")
    ) -> None:
        self.decide = decide
        self.calls: list[ClaimedMessage] = []

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        self.calls.extend(messages)
        return [self.decide(m) for m in messages]

    def close(self) -> None:
        pass


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5,
               on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` after ``timeout_s``
    (for real processes whose progress has no database clock to move)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{on_timeout()}" if on_timeout else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}", pytrace=False)
        time.sleep(interval_s)


class QueriesDatabase:
    """``connect`` / ``query`` / ``scalar`` over ``self.database_url``: a mixin for the process harnesses."""

    database_url: str

    def connect(self, autocommit: bool = True) -> DictConnection:
        return psycopg.connect(self.database_url, autocommit=autocommit, row_factory=dict_row, connect_timeout=10)

    def query(self, statement: str, params: Any = None) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return conn.execute(statement, params).fetchall()

    def scalar(self, statement: str, params: Any = None) -> Any:
        rows = self.query(statement, params)
        return next(iter(rows[0].values())) if rows else None


def free_port() -> int:
    """A port nothing listens on now (for a server started in another process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen | None, grace_s: float = 30) -> None:
    """Stop a process the test started, by its pid: SIGTERM (an orderly stop, as Ctrl-C or a deploy would),
    SIGKILL if it has not exited within ``grace_s``."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_processes(processes: list[subprocess.Popen], grace_s: float = 30) -> None:
    """Stop every process the test started with SIGTERM, all at once, as a deploy would. One that has not
    exited within ``grace_s`` fails the test with its Python stacks (py-spy), then is killed: a process that
    ignores an orderly stop is a bug to see, not a cleanup to hide."""
    alive = [process for process in processes if process.poll() is None]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + grace_s
    stuck: list[str] = []
    for process in alive:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stuck.append(f"pid {process.pid} ignored SIGTERM for {grace_s:.0f}s:\n{python_stacks(process.pid)}")
            process.kill()
            process.wait()
    assert not stuck, "\n".join(stuck)


def python_stacks(pid: int) -> str:
    """Every thread's stack of a running Python process (py-spy, in the dev extra), for a failure message."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        return "(py-spy is not installed: no stacks)"
    dump = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    return dump.stdout + dump.stderr


def wait_for_port(port: int, process: subprocess.Popen, seconds: float = 30) -> None:
    """Wait until the process listens (a bare TCP connect: no HTTP request that a server would count)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")
