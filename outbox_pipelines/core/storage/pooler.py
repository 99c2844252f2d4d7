"""Connection poolers (PgBouncer and its kind) between us and PostgreSQL: telling one is there, and what changes.

A transaction pooler hands each transaction to whichever server connection is free, so nothing that
lives in a session survives between two transactions: server-side prepared statements, LISTEN, session
advisory locks, and settings given at connect (PgBouncer refuses the ``options`` startup parameter
outright). A pooler answers the client's startup itself and makes up the backend pid it reports; the
server's own ``pg_backend_pid()`` then differs, which is how ``behind_pooler`` tells.

What the engine does about it (docs/deploy.md, "Behind PgBouncer"):
- its own connections stop preparing statements (``db.connect``);
- a relay's session (LISTEN wake-ups, the single-active lock) goes to ``OUTBOX_DIRECT_DATABASE_URL``
  when it is set; without it a competing table's relay polls, and a single-active table's relay refuses
  to start (its lock would be held by whichever client the pooler pairs with that server connection).
"""

import logging
import os
from collections.abc import Mapping

import psycopg

from outbox_pipelines.core.storage.queries import shared_query

DIRECT_DATABASE_URL_ENV = "OUTBOX_DIRECT_DATABASE_URL"

log = logging.getLogger("outbox_pipelines.pooler")
_said: set[str] = set()


def behind_pooler(conn: psycopg.Connection) -> bool:
    """True when the backend pid the connection was given is not the server's: a pooler answered."""
    row = conn.execute(shared_query("server_backend_pid")).fetchone()
    pid = row["pid"] if isinstance(row, Mapping) else row[0] if row else None
    return pid != conn.info.backend_pid


def direct_database_url(env: Mapping[str, str] | None = None) -> str | None:
    """A connection that keeps its session (not through a transaction pooler), for what needs one."""
    env = os.environ if env is None else env
    return env.get(DIRECT_DATABASE_URL_ENV, "").strip() or None


def say_once(key: str, message: str) -> None:
    """Log ``message`` at WARNING the first time ``key`` comes up in this process."""
    if key not in _said:
        _said.add(key)
        log.warning("%s", message)
