"""Connection poolers (PgBouncer and its kind) between us and PostgreSQL: telling one is there, and what changes.

``behind_pooler`` tells one by the backend pid it makes up. Behind a transaction pooler nothing of a session
survives: the engine stops preparing statements and a relay's session needs ``OUTBOX_DIRECT_DATABASE_URL``.
Why: docs/explanation/storage.md, "Behind a pooler"; how: docs/deploy.md, "Behind PgBouncer".
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
