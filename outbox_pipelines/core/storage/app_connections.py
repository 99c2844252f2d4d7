"""What an application passes to ``enqueue`` and ``enqueue_async``, resolved to the connection the statement
runs on, and refused, before anything is written, when it is the wrong kind or has no transaction open.

The message joins the application's transaction; a connection that would commit it alone is refused unless
``outside_transaction=True``. Duck-typed: the engine imports neither SQLAlchemy, Django nor asyncpg
(docs/how-to/enqueue-from-your-stack.md).
"""

import inspect
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from outbox_pipelines.core.errors import NoTransaction

SYNC_KINDS = (
    "a psycopg 3 Connection or Cursor, a SQLAlchemy Connection or Session on postgresql+psycopg://, "
    "or Django's connection (django.db.connection) inside transaction.atomic()"
)
ASYNC_KINDS = (
    "a psycopg 3 AsyncConnection or AsyncCursor, a SQLAlchemy AsyncConnection or AsyncSession on "
    "postgresql+psycopg:// or postgresql+asyncpg://, or an asyncpg connection inside conn.transaction()"
)
_OUTSIDE = "(or pass outside_transaction=True to write the message on its own, committed at once)"


def _named(conn: Any) -> str:
    kind = type(conn)
    return f"{kind.__module__}.{kind.__qualname__}"


def _wrong_kind(conn: Any, *, asyncio: bool) -> TypeError:
    accepted = ASYNC_KINDS if asyncio else SYNC_KINDS
    call = "enqueue_async" if asyncio else "enqueue"
    return TypeError(f"{call} needs {accepted}; got {_named(conn)}")


def _psycopg2(conn: Any, where: str) -> TypeError:
    fix = (
        "install psycopg 3 (pip install 'psycopg[binary]'): Django uses it when it is installed"
        if where == "Django"
        else "change the engine's URL to postgresql+psycopg:// (on SQLAlchemy 2.0 a bare postgresql:// means psycopg2)"
    )
    return TypeError(f"enqueue runs on psycopg 3, and this {where} connection is on psycopg2 ({_named(conn)}): {fix}")


def _is_asyncpg(conn: Any) -> bool:
    return type(conn).__module__.split(".")[0] == "asyncpg"


def _is_django(conn: Any) -> bool:
    # django.db.backends.base.base.BaseDatabaseWrapper, by what it has.
    return hasattr(conn, "in_atomic_block") and hasattr(conn, "ensure_connection") and hasattr(conn, "vendor")


def _on_class(conn: Any, name: str) -> Any:
    # Looked up on the class: AsyncConnection's ``connection`` is a property that raises when read.
    return getattr(type(conn), name, None)


def _is_sqlalchemy_session(conn: Any) -> bool:
    # A Session or AsyncSession (scoped_session and async_scoped_session proxy the same two methods).
    return inspect.isfunction(_on_class(conn, "connection")) and callable(_on_class(conn, "get_bind"))


def _is_sqlalchemy_async_connection(conn: Any) -> bool:
    return _on_class(conn, "sync_connection") is not None and inspect.iscoroutinefunction(
        _on_class(conn, "exec_driver_sql")
    )


def _is_sqlalchemy_connection(conn: Any) -> bool:
    return callable(_on_class(conn, "in_transaction")) and callable(_on_class(conn, "exec_driver_sql"))


def _refuse_async_given_to_sync(conn: Any) -> None:
    asyncio_kind = (
        isinstance(conn, (psycopg.AsyncConnection, psycopg.AsyncCursor))
        or _is_asyncpg(conn)
        or _is_sqlalchemy_async_connection(conn)
        or (_is_sqlalchemy_session(conn) and inspect.iscoroutinefunction(_on_class(conn, "connection")))
    )
    if asyncio_kind:
        raise TypeError(
            f"{_named(conn)} is an asyncio connection: use `await outbox.enqueue_async(conn, message)` "
            "(and enqueue_many_async), which run on it without blocking the event loop"
        )


def _refuse_sync_given_to_async(conn: Any) -> None:
    if _is_django(conn):
        raise TypeError(
            "Django's connection is synchronous: call outbox.enqueue(connection, message) inside "
            "transaction.atomic(), from an async view through asgiref's sync_to_async"
        )
    sync_kind = (
        isinstance(conn, (psycopg.Connection, psycopg.Cursor))
        or (_is_sqlalchemy_session(conn) and not inspect.iscoroutinefunction(_on_class(conn, "connection")))
        or (_is_sqlalchemy_connection(conn) and not _is_sqlalchemy_async_connection(conn))
    )
    if sync_kind:
        raise TypeError(
            f"{_named(conn)} is a synchronous connection: use outbox.enqueue(conn, message) "
            "(in an async service, enqueue_async on its async connection or session)"
        )


def check_in_transaction(pg: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], outside: bool) -> None:
    """An autocommit psycopg connection outside ``with conn.transaction()`` would commit the message on its own."""
    if outside or not pg.autocommit or pg.info.transaction_status != TransactionStatus.IDLE:
        return
    raise NoTransaction(
        "enqueue on a psycopg connection in autocommit, outside any transaction, would commit the message "
        "apart from the business write: open the transaction first (`with conn.transaction():` or a "
        f"connection without autocommit) {_OUTSIDE}"
    )


def sync_target(conn: Any, *, outside_transaction: bool = False) -> Any:
    """The psycopg ``Connection`` or ``Cursor`` a synchronous enqueue runs on, inside the caller's transaction."""
    if isinstance(conn, psycopg.Connection):
        check_in_transaction(conn, outside_transaction)
        return conn
    if isinstance(conn, psycopg.Cursor):
        check_in_transaction(conn.connection, outside_transaction)
        return conn
    _refuse_async_given_to_sync(conn)
    if _is_django(conn):
        return _django_connection(conn, outside_transaction)
    if _is_sqlalchemy_session(conn):
        conn = conn.connection()  # the session's connection, in its transaction (begun if need be)
    if _is_sqlalchemy_connection(conn):
        return _sqlalchemy_driver(conn, outside_transaction)
    raise _wrong_kind(conn, asyncio=False)


def _sqlalchemy_driver(conn: Any, outside: bool) -> psycopg.Connection[Any]:
    pg = conn.connection.driver_connection
    if not isinstance(pg, psycopg.Connection):
        if type(pg).__module__.startswith("psycopg2"):
            raise _psycopg2(pg, "SQLAlchemy")
        raise _wrong_kind(conn, asyncio=False)
    check_in_transaction(pg, outside)
    if not conn.in_transaction():
        # Begun as SQLAlchemy's autobegin would: the caller's conn.commit() then commits the message.
        conn.begin()
    return pg


def _django_connection(conn: Any, outside: bool) -> psycopg.Connection[Any]:
    if conn.vendor != "postgresql":
        raise TypeError(f"outbox tables live in PostgreSQL; this Django connection is {conn.vendor!r} ({conn.alias})")
    if not outside and not conn.in_atomic_block and conn.get_autocommit():
        raise NoTransaction(
            f"Django's connection {conn.alias!r} is in autocommit, outside transaction.atomic(): the message "
            "would commit apart from the models. Enqueue inside `with transaction.atomic(using="
            f"{conn.alias!r}):` {_OUTSIDE}"
        )
    conn.ensure_connection()
    pg = conn.connection
    if not isinstance(pg, psycopg.Connection):
        raise _psycopg2(pg, "Django")
    return pg


async def async_target(conn: Any, *, outside_transaction: bool = False) -> "AsyncTarget":
    """Where an asyncio enqueue runs its statements, inside the caller's transaction."""
    if isinstance(conn, psycopg.AsyncConnection):
        check_in_transaction(conn, outside_transaction)
        return AsyncTarget(conn, "psycopg")
    if isinstance(conn, psycopg.AsyncCursor):
        check_in_transaction(conn.connection, outside_transaction)
        return AsyncTarget(conn, "psycopg")
    if _is_asyncpg(conn):
        if not outside_transaction and not conn.is_in_transaction():
            raise NoTransaction(
                "enqueue_async on an asyncpg connection outside a transaction would commit the message apart "
                f"from the business write: enqueue inside `async with conn.transaction():` {_OUTSIDE}"
            )
        return AsyncTarget(conn, "asyncpg")
    _refuse_sync_given_to_async(conn)
    if _is_sqlalchemy_session(conn):
        conn = await conn.connection()  # the session's AsyncConnection, in its transaction
    if _is_sqlalchemy_async_connection(conn):
        return await _sqlalchemy_async(conn, outside_transaction)
    raise _wrong_kind(conn, asyncio=True)


async def _sqlalchemy_async(conn: Any, outside: bool) -> "AsyncTarget":
    if conn.sync_connection is None:
        await conn.start()
    raw = conn.sync_connection.connection
    driver = raw.driver_connection
    if isinstance(driver, psycopg.AsyncConnection):
        check_in_transaction(driver, outside)
    elif _is_asyncpg(driver):
        if not outside and raw.dbapi_connection.autocommit:
            raise NoTransaction(
                "enqueue_async on a SQLAlchemy connection with isolation_level='AUTOCOMMIT' would commit the "
                f"message apart from the business write: use the engine's default isolation {_OUTSIDE}"
            )
    else:
        raise _wrong_kind(conn, asyncio=True)
    if not conn.in_transaction():
        await conn.begin()  # as SQLAlchemy's autobegin would: the caller's commit() commits the message
    if isinstance(driver, psycopg.AsyncConnection):
        return AsyncTarget(driver, "psycopg")
    # SQLAlchemy's asyncpg adapter opens asyncpg's transaction at its first statement: the statement goes
    # through SQLAlchemy, never straight to the asyncpg connection (which could still be outside it).
    return AsyncTarget(conn, "sqlalchemy")


class AsyncTarget:
    """The connection an asyncio enqueue runs on and how to speak to it: ``psycopg`` (an AsyncConnection or
    AsyncCursor, ``%s`` placeholders), ``asyncpg`` (``$1``) or ``sqlalchemy`` (an AsyncConnection on asyncpg,
    through ``exec_driver_sql``, ``$1``)."""

    __slots__ = ("conn", "driver")

    def __init__(self, conn: Any, driver: str) -> None:
        self.conn = conn
        self.driver = driver

    @property
    def numbered(self) -> bool:
        """Whether statements take ``$1`` placeholders (asyncpg's) rather than psycopg's ``%s``."""
        return self.driver != "psycopg"
