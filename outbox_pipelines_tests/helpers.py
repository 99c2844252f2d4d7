"""Small helpers shared by the tests (the process helpers live in processes.py, row states in rows.py)."""

import shutil
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.storage import db
from outbox_pipelines.core.storage.embedded_as_root import RELOCATED_DATA_BASE
from outbox_pipelines_tests.processes import free_port as free_port
from outbox_pipelines_tests.processes import python_stacks as python_stacks
from outbox_pipelines_tests.processes import stop_process as stop_process
from outbox_pipelines_tests.processes import stop_processes as stop_processes
from outbox_pipelines_tests.processes import wait_for_port as wait_for_port
from outbox_pipelines_tests.processes import wait_until as wait_until

DictConnection = psycopg.Connection[DictRow]


def order_payload(i: int, key: str | None = None) -> dict[str, Any]:
    """A valid OrderRequest v1.1 (outbox_orders rows are orders: the broker adapter maps them)."""
    return {
        "order_id": f"ord-{i}",
        "instrument": "USDJPY",
        "side": "BUY" if i % 2 else "SELL",
        "qty": 0.1,
        "price": None,
        "time_in_force": "IOC",
        "tags": [],
        "idempotency_key": key or f"key-{i}",
        "requested_at": "2026-01-01T00:00:00Z",
    }


def enqueue_n(
    conn: DictConnection,
    table_name: str,
    n: int,
    *,
    topic: str = "t",
    prefix: str = "e",
    payload: Callable[[int], dict[str, Any]] | None = None,
) -> list[int]:
    if payload is None and table_name == "outbox_orders":
        payload = order_payload
    messages = [
        Message(topic=topic, payload=payload(i) if callable(payload) else {"n": i}, event_id=f"{prefix}{i}")
        for i in range(n)
    ]
    return [r.id for r in Outbox(table_name).enqueue_many(conn, messages, outside_transaction=True)]


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

    def __init__(self, decide: Callable[[ClaimedMessage], Outcome] = lambda m: Outcome.sent(ref=f"ref-{m.id}")) -> None:
        self.decide = decide
        self.calls: list[ClaimedMessage] = []

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        self.calls.extend(messages)
        return [self.decide(m) for m in messages]

    def close(self) -> None:
        pass


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


def stop_project_server(outbox_dir: Path) -> None:
    """Stop a test project's embedded server (by the pid in its postmaster.pid: only that test's) and remove its
    data where it was kept outside the project (run as root, under RELOCATED_DATA_BASE), which would otherwise
    stay there, 50-70 MB a project, until a later relocation finds the project's directory gone."""
    data = outbox_dir / "pgdata"
    kept = data.resolve().parent if data.is_symlink() else None
    db.stop_embedded(outbox_dir)
    if (
        kept is not None
        and kept.parent == RELOCATED_DATA_BASE  # one project's directory there, never the base itself
        and _origin(kept) == outbox_dir.resolve()  # this project's, as its origin file says
        and not (kept / "pgdata" / "postmaster.pid").exists()  # its server is gone
    ):
        shutil.rmtree(kept, ignore_errors=True)


def _origin(kept: Path) -> Path | None:
    try:
        return Path((kept / "origin").read_text().strip()).resolve()
    except OSError:
        return None


def accept_order(conn: DictConnection, *args: Any, **kwargs: Any) -> Any:
    """The Order API's acceptance (``orders.ledger.accept_order``: the ledger row and the order's message) in one
    transaction, as the API runs it; a savepoint where ``conn`` is in a transaction already."""
    from outbox_pipelines.orders.ledger import accept_order as accept

    with conn.transaction():
        return accept(conn, *args, **kwargs)
