"""The relay's database sessions: how they are opened, and waiting on the table's wake-up channel."""

import threading
import time

import psycopg
from psycopg import sql

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.names import notify_channel

STATEMENT_TIMEOUT_MS = 30_000
# Custom plans for the relay's statements: a generic plan guesses a handful of input rows and
# turns the batched settle into a nested loop, quadratic in the batch size (measured: 264 ms
# instead of 23 ms for 1,000 rows). Planning each execution costs well under a millisecond.
RELAY_SESSION_OPTIONS = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c plan_cache_mode=force_custom_plan"


def open_session(url: str) -> psycopg.Connection:
    """A connection with the relay's session settings (the lease keeper's, a goodbye's, the relay's own)."""
    return connect(url, options=RELAY_SESSION_OPTIONS)


def open_listening_session(url: str, table_name: str) -> psycopg.Connection:
    """The relay's own connection: it LISTENs on the table's channel, so an enqueue wakes an idle relay."""
    conn = open_session(url)
    # LISTEN takes the channel as an identifier, which no query parameter can bind: composed, quoted, here.
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(table_name))))
    return conn


def wait_for_wakeup(conn: psycopg.Connection, seconds: float, stop: threading.Event) -> None:
    """Sleep up to ``seconds``, waking at once on a NOTIFY or a stop request.

    psycopg keeps notifications that arrive during other statements in a
    backlog that ``notifies()`` yields first, so a wake-up is never missed.
    """
    deadline = time.monotonic() + max(seconds, 0.0)
    woken = False
    while not woken and not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # Slices keep a stop request prompt; a NOTIFY ends the wait immediately.
        for _ in conn.notifies(timeout=min(remaining, 0.25), stop_after=1):
            woken = True


def drop_stale_wakeups(conn: psycopg.Connection) -> None:
    """Empty the notification backlog while busy, so it cannot grow without bound."""
    for _ in conn.notifies(timeout=0):
        pass
