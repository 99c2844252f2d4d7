"""Connections to the database: ``connect`` opens one of our own, fitted to a connection pooler if one is in
between; ``driver_connection`` finds the psycopg connection inside what the application passes in (enqueue
joins its transaction), ``statement_cursor`` the application's cursor to run on."""

import inspect
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import DatabaseUnavailable
from outbox_pipelines.core.redaction import mask_url
from outbox_pipelines.core.storage import network_limits, pooler
from outbox_pipelines.core.storage.database_url import _bad_url, psycopg_url, refuse_two_way_url, scrub


def connect(url: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection:
    """A psycopg connection, or DatabaseUnavailable / InvalidDatabaseUrl with a message that says what to check.

    Neither message holds the password, and neither is chained to psycopg's
    exception (whose text may quote the URL). Behind a connection pooler the
    connection prepares no statement, and session settings a pooler refuses at
    connect (``options``) are dropped with a warning (core/storage/pooler.py).
    """
    error: Exception
    refuse_two_way_url(url)  # before libpq reads a host out of the password (and asks DNS for it)
    try:
        conn = psycopg.connect(
            psycopg_url(url), autocommit=autocommit, row_factory=dict_row, **network_limits.params(url, kwargs)
        )
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "options" in kwargs and _POOLER_REFUSES_OPTIONS in reason:
            pooler.say_once(
                f"options {mask_url(url)}",
                (
                    f"the connection pooler at {mask_url(url)} refuses session settings at connect "
                    f"({kwargs['options']}); connecting without them. Set them on the database role instead "
                    "(ALTER ROLE ... SET statement_timeout = '30s'), or in the pooler (PgBouncer's query_timeout)."
                ),
            )
            return connect(url, autocommit=autocommit, **{k: v for k, v in kwargs.items() if k != "options"})
        error = DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {mask_url(url)}: {scrub(reason, url)}. "
            "Check that the server is running and OUTBOX_DATABASE_URL is right "
            "(unset it to use the embedded server under .outbox/)."
        )
    except psycopg.ProgrammingError as exc:
        error = _bad_url(url, str(exc).strip() or "libpq cannot parse it")
    else:
        _fit_to_pooler(conn)
        return conn
    raise error


# PgBouncer's answer to a startup packet carrying ``options`` (1.18; later releases accept a few settings).
_POOLER_REFUSES_OPTIONS = "unsupported startup parameter"


def _fit_to_pooler(conn: psycopg.Connection) -> None:
    """Behind a pooler, prepare no statement: a transaction pooler runs each transaction on whichever
    server connection is free, where a statement prepared on another one does not exist."""
    if pooler.behind_pooler(conn):
        conn.prepare_threshold = None
    if not conn.autocommit:
        conn.rollback()  # the check's transaction: the caller starts with none open


def driver_connection(conn: Any) -> psycopg.Connection:
    """The psycopg connection behind what the application passes in: a psycopg connection or cursor, a
    SQLAlchemy Connection or Session (its connection in the session's transaction, begun if need be).

    Enqueue runs on the caller's connection so that it joins the caller's
    transaction: a rollback removes the message with the business write.
    """
    if isinstance(conn, psycopg.Connection):
        return conn
    if isinstance(conn, psycopg.Cursor):
        return conn.connection
    # An AsyncSession's connection() is a coroutine, never awaited here: refused below, as what it is.
    given = conn.connection() if _is_sqlalchemy_session(conn) and not _is_async(conn) else conn
    dbapi = getattr(getattr(given, "connection", None), "driver_connection", None)
    if isinstance(dbapi, psycopg.Connection):
        return dbapi
    raise TypeError(
        "enqueue needs a psycopg 3 connection or cursor, or a SQLAlchemy Connection or Session on the psycopg "
        f"driver (postgresql+psycopg://), got {type(conn).__name__}"
    )


# The cursors an enqueue can run its statement on as they are: %s placeholders, results to fetch.
# A RawCursor takes $1 placeholders and a ServerCursor declares a named cursor, which an INSERT cannot
# be; on those, as on a connection, the enqueue opens a cursor of its own.
_STATEMENT_CURSORS = (psycopg.Cursor, psycopg.ClientCursor)


def statement_cursor(conn: Any) -> psycopg.Cursor | None:
    """The application's own cursor when ``conn`` is one an enqueue can run on (saving the cursor it
    would otherwise open: about 10 µs of the 50 or so the one-row enqueue adds to a transaction,
    bench/results.md); else None."""
    return conn if type(conn) in _STATEMENT_CURSORS else None


def _is_sqlalchemy_session(conn: Any) -> bool:
    # Duck-typed (a Session or a scoped_session): the core imports no SQLAlchemy to enqueue.
    return callable(getattr(conn, "connection", None)) and callable(getattr(conn, "get_bind", None))


def _is_async(conn: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(conn, "connection", None))
