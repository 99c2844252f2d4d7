"""The relay's database sessions: how they are opened, and waiting on the table's wake-up channel."""

import time
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.types.json import set_json_loads

from outbox_pipelines.core.canonical import loads_jsonb_text
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.names import notify_channel
from outbox_pipelines.core.relay.stop import StopRequest
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage import pooler
from outbox_pipelines.core.storage.db import connect, mask_url

STATEMENT_TIMEOUT_MS = 30_000
# Plans. The claim, the settle of a batch delivered whole and the next-due read are prepared once per session
# and run a generic plan: parsing and planning them anew cost about 1 ms each a batch, a fifth of a batch of 100
# (bench/results.md), and their generic plans run as fast as planned ones from 1 to 5,000 rows. The other settles
# (a retry or a death in the batch) are planned for their parameters each time. No sequential or bitmap scans:
# a generic plan made while a table was small, or its pending rows few, would otherwise keep reading them all
# (and sorting them, for a claim) as they grow: each claim of a burst read the whole burst (bench/results.md).
RELAY_SESSION_OPTIONS = (
    f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c plan_cache_mode=force_generic_plan"
    " -c enable_seqscan=off -c enable_bitmapscan=off"
)
_PREPARED_ONLY_WHEN_ASKED = 2**31 - 1  # psycopg's prepare_threshold: None would refuse prepare=True too


def open_session(url: str) -> psycopg.Connection:
    """A connection with the relay's session settings (the lease keeper's, a goodbye's, the relay's own)."""
    conn = connect(url, options=RELAY_SESSION_OPTIONS)
    set_json_loads(loads_jsonb_text, conn)
    if conn.prepare_threshold is not None:  # None: behind a transaction pooler, nothing is prepared
        conn.prepare_threshold = _PREPARED_ONLY_WHEN_ASKED
    return conn


@dataclass
class RelaySession:
    """The relay's own connection, and whether it LISTENs (not through a transaction pooler)."""

    conn: psycopg.Connection
    listening: bool


def open_relay_session(url: str, table: TableSettings, direct_url: str | None = None) -> RelaySession:
    """The relay's own connection: it LISTENs on the table's channel, so an enqueue wakes an idle relay.

    ``direct_url`` (OUTBOX_DIRECT_DATABASE_URL), when set, is a connection that keeps its session and
    carries the relay's session whole. Without it, behind a pooler (core/storage/pooler.py) a competing table's
    relay polls every ``idle_sleep_s``, and a single-active one refuses: ConfigError says what to set.
    """
    conn = open_session(direct_url or url)
    # db.connect asked the server already, and turned statement preparation off behind a pooler.
    if direct_url is None and conn.prepare_threshold is None:
        if table.mode == "single-active":
            conn.close()
            raise ConfigError(
                f"table {table.name} is single-active: its relay holds a session lock, which cannot pass the "
                f"connection pooler at {mask_url(url)}. Set {pooler.DIRECT_DATABASE_URL_ENV} to a direct "
                "connection to PostgreSQL (or a session-mode pool) for the relay's session, "
                f'or make the table competing (mode = "competing").'
            )
        pooler.say_once(
            f"listen {mask_url(url)}",
            (
                f"relay {table.name}: a connection pooler sits between the relay and PostgreSQL at {mask_url(url)}, "
                f"and LISTEN/NOTIFY cannot pass a transaction pooler: polling every {table.idle_sleep_s:g}s instead "
                f"of waking on enqueue. Set {pooler.DIRECT_DATABASE_URL_ENV} to a direct connection to wake at once."
            ),
        )
        return RelaySession(conn, listening=False)
    # LISTEN takes the channel as an identifier, which no query parameter can bind: composed, quoted, here.
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(table.name))))
    return RelaySession(conn, listening=True)


def wait_for_wakeup(session: RelaySession, seconds: float, stop: StopRequest) -> None:
    """Sleep up to ``seconds``, waking at once on a NOTIFY (when the session LISTENs) or a stop request.

    psycopg keeps notifications that arrive during other statements in a
    backlog that ``notifies()`` yields first, so a wake-up is never missed.
    Woken, it also takes the notifications already on the socket (psycopg hands
    over its backlog whole, not these): the claim that follows sees every row
    they announced, and each would otherwise wake the relay for an empty claim.
    """
    if not session.listening:
        stop.wait(max(seconds, 0.0))
        return
    deadline = time.monotonic() + max(seconds, 0.0)
    woken = False
    while not woken and not stop.requested:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # Slices keep a stop request prompt; a NOTIFY ends the wait immediately.
        for _ in session.conn.notifies(timeout=min(remaining, 0.25), stop_after=1):
            woken = True
    if woken:
        take_wakeups(session)


def take_wakeups(session: RelaySession) -> bool:
    """Empty the notification backlog and the socket, so neither grows without bound while the relay
    is busy; whether any NOTIFY was there (a message committed since the last claim may be ready)."""
    taken = False
    if session.listening:
        for _ in session.conn.notifies(timeout=0):
            taken = True
    return taken
