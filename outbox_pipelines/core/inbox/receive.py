"""``Inbox``: a consumer records a message id in its own transaction, so a redelivered message's effect happens once.

The claim is one INSERT on the primary key (consumer, message_id) that does nothing on a conflict (sql/queries/
inbox.sql); the connection is resolved as enqueue's is (core/storage/app_connections.py). docs/how-to/inbox.md.
"""

from typing import Any

import psycopg

from outbox_pipelines.core.enqueue_guard import async_endpoint, sync_endpoint
from outbox_pipelines.core.errors import (
    ConfigError,
    InvalidMessage,
    InvalidTableName,
    MigrationError,
    NoTransaction,
    UnknownTable,
)
from outbox_pipelines.core.models import MAX_INBOX_CONSUMER_CHARS, MAX_INBOX_MESSAGE_ID_CHARS, unprintable_problem
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.storage.app_connections import (
    ASYNC_KINDS,
    SYNC_KINDS,
    AsyncTarget,
    async_target,
    sync_target,
)
from outbox_pipelines.core.storage.connections import driver_connection, statement_cursor
from outbox_pipelines.core.storage.queries import numbered_table_query, table_query
from outbox_pipelines.core.storage.statements import sqlstate_of

RECEIVE = "inbox_receive"
# SQLSTATEs of a table that is missing (42P01), or that is there without an inbox's columns (42703, 42P10).
_NOT_AN_INBOX = {"42P01": "does not exist", "42703": "is not an inbox table", "42P10": "is not an inbox table"}


def inbox_name(name: object) -> str:
    """``name`` as an inbox table's name, or InvalidTableName saying so (the rules are the outbox tables')."""
    try:
        return validate_table_name(name)
    except InvalidTableName as exc:
        raise InvalidTableName(
            str(exc).replace("outbox table", "inbox table").replace("billing_outbox", "billing_inbox")
        ) from None


def _checked(label: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(
            f"{label} must be a str, got {type(value).__name__} (decode a bytes header first); nothing was recorded"
        )
    if not value or len(value) > limit:
        raise InvalidMessage(
            f"{label} must be a non-empty string of at most {limit} characters (got {len(value)}); nothing was recorded"
        )
    problem = unprintable_problem(value)
    if problem is not None:
        raise InvalidMessage(f"{label} contains {problem}: it must be printable text; nothing was recorded")
    return value


def _unknown(table_name: str, why: str) -> UnknownTable:
    return UnknownTable(
        f"inbox table {table_name!r} {why}: declare it in outbox.toml as [inboxes.{table_name}] and run "
        "'outbox-pipelines db upgrade', which creates every declared inbox; nothing was recorded"
    )


def _no_transaction(asyncio: bool) -> NoTransaction:
    call = "await inbox.receive_async(conn, ...)" if asyncio else "inbox.receive(conn, ...)"
    return NoTransaction(
        f"{call} outside a transaction would record the message apart from the consumer's work (a crash between "
        "the two loses the effect, or repeats it): call it inside the transaction that does the work (`with "
        "conn.transaction():`, `engine.begin()`, `transaction.atomic()`, asyncpg's `conn.transaction()`); "
        "nothing was recorded"
    )


def _behind(exc: MigrationError | ConfigError) -> MigrationError | ConfigError:
    """enqueue's refusal of a schema behind the code (or of asyncpg's named statements behind a pooler), said of
    the inbox."""
    text = str(exc).replace("enqueue_async refused, nothing was written", "receive_async refused, nothing was recorded")
    return type(exc)(text.replace("enqueue refused, nothing was written", "receive refused, nothing was recorded"))


def _wrong_kind(conn: Any, exc: TypeError, asyncio: bool) -> TypeError:
    if "psycopg2" in str(exc):
        return TypeError(str(exc).replace("enqueue runs", "the inbox runs"))
    kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
    if asyncio:
        return TypeError(
            f"Inbox.receive_async needs {ASYNC_KINDS}; got {kind} (a synchronous connection: inbox.receive(conn, ...))"
        )
    return TypeError(
        f"Inbox.receive needs {SYNC_KINDS}; got {kind} (an asyncio connection: await inbox.receive_async(conn, ...))"
    )


class Inbox:
    """One inbox table, as a consumer sees it.

    >>> inbox = Inbox("billing_inbox")
    >>> with engine.begin() as conn:  # the consumer's transaction
    ...     if inbox.receive(conn, message_id, consumer="billing"):
    ...         conn.execute(...)  # the effect, once

    ``receive`` takes the synchronous connections ``Outbox.enqueue`` takes, ``receive_async`` the asyncio ones;
    each inside the caller's transaction (one with none open is refused: the record would commit alone).
    """

    def __init__(self, table_name: str) -> None:
        self.table_name = inbox_name(table_name)

    def _params(self, message_id: object, consumer: object) -> tuple[str, str]:
        """inbox_receive's parameters, (consumer, message_id), once both are found fit to record."""
        checked_id = _checked("message_id", message_id, MAX_INBOX_MESSAGE_ID_CHARS)
        return _checked("consumer", consumer, MAX_INBOX_CONSUMER_CHARS), checked_id

    def receive(self, conn: Any, message_id: str, *, consumer: str) -> bool:
        """Record ``message_id`` as received by ``consumer`` in the caller's transaction: True the first time (do
        the work now, in the same transaction), False for a message already received (do nothing).

        A concurrent transaction receiving the same message makes this call wait for it to end: then False if it
        committed, True if it rolled back."""
        params = self._params(message_id, consumer)
        try:
            target = sync_target(conn)
        except NoTransaction:
            raise _no_transaction(asyncio=False) from None
        except TypeError as exc:
            raise _wrong_kind(conn, exc, asyncio=False) from None
        try:
            prepare = sync_endpoint(target).prepare  # the schema checked once per process, as enqueue's
        except MigrationError as exc:
            raise _behind(exc) from None
        statement = table_query(RECEIVE, self.table_name)
        cursor = statement_cursor(target)
        try:
            if cursor is not None:  # the application's own cursor: its result replaced, its rows untouched
                return cursor.execute(statement, params, prepare=prepare).rowcount == 1
            with driver_connection(target).cursor() as cur:
                return cur.execute(statement, params, prepare=prepare).rowcount == 1
        except psycopg.Error as exc:
            if sqlstate_of(exc) in _NOT_AN_INBOX:
                raise self._refusal(exc) from None
            raise

    async def receive_async(self, conn: Any, message_id: str, *, consumer: str) -> bool:
        """``receive`` on the caller's asyncio connection (psycopg, asyncpg, SQLAlchemy's), in its transaction."""
        params = self._params(message_id, consumer)
        try:
            target = await async_target(conn)
        except NoTransaction:
            raise _no_transaction(asyncio=True) from None
        except TypeError as exc:
            raise _wrong_kind(conn, exc, asyncio=True) from None
        try:
            prepare = (await async_endpoint(target)).prepare
        except (MigrationError, ConfigError) as exc:
            raise _behind(exc) from None
        try:
            return await self._claim_async(target, params, prepare)
        except Exception as exc:
            if sqlstate_of(exc) in _NOT_AN_INBOX:
                raise self._refusal(exc) from None
            raise

    async def _claim_async(self, target: AsyncTarget, params: tuple[str, str], prepare: bool | None) -> bool:
        if target.driver == "psycopg":
            pg = target.conn if isinstance(target.conn, psycopg.AsyncConnection) else target.conn.connection
            async with pg.cursor() as cur:
                await cur.execute(table_query(RECEIVE, self.table_name), params, prepare=prepare)
                return cur.rowcount == 1
        statement, _ = numbered_table_query(RECEIVE, self.table_name)  # $1, $2: consumer, message_id
        if target.driver == "asyncpg":
            return str(await target.conn.execute(statement, *params)) == "INSERT 0 1"  # the command's tag
        return int((await target.conn.exec_driver_sql(statement, params)).rowcount) == 1

    def _refusal(self, exc: BaseException) -> UnknownTable:
        return _unknown(self.table_name, _NOT_AN_INBOX[sqlstate_of(exc) or "42P01"])
