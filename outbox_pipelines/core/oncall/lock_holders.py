"""Sessions holding a table's ordering locks for long: named by ``status`` and the blocked-keys check.

A session keeping stripes longer than the outbox's milliseconds holds back those keys' later messages. Named by pid,
application, login, how long and how many stripes: never what it runs.
Why and how: docs/explanation/ordering-keys.md, "Who holds a key's lock".
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.storage.queries import shared_query

# Held this long, a stripe is nobody's of the outbox's own: its writers and settles hold one for milliseconds.
HELD_LONG_S = 10.0


@dataclass(frozen=True)
class LockHolder:
    pid: int
    application_name: str | None
    login: str | None
    stripes: int
    exclusive: bool
    outside_transaction: bool
    held_s: float | None

    def described(self) -> str:
        """e.g. "pid 4242 (application 'psql', login 'bob') holds 512 stripes, exclusively, for 5 min"."""
        who = f"application {self.application_name or '?'!r}, login {self.login or '?'!r}"
        how = ", exclusively" if self.exclusive else ""
        held = f" for {duration_words(self.held_s)}" if self.held_s is not None else ""
        where = " outside any transaction" if self.outside_transaction else ""
        plural = "" if self.stripes == 1 else "s"
        return f"pid {self.pid} ({who}) holds {self.stripes} stripe{plural}{how}{held}{where}"


def held_long(conn: psycopg.Connection[Any], table_name: str, now: datetime | None = None) -> list[LockHolder]:
    """The sessions holding the table's ordering stripes for long (HELD_LONG_S, or outside any transaction)."""
    try:
        # A savepoint inside the caller's transaction: a schema without the function leaves that transaction usable.
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(shared_query("outbox_ordering_lock_holders"), {"table_name": table_name, "now": now})
            holders = [LockHolder(**row) for row in rows.fetchall()]
    except psycopg.errors.UndefinedFunction:
        return []  # a schema older than migration 0018: the version check says so elsewhere
    return [h for h in holders if h.outside_transaction or (h.held_s is not None and h.held_s >= HELD_LONG_S)]


def holders_text(table_name: str, holders: list[dict[str, Any]]) -> str:
    """One sentence for `status` and the blocked-keys check ('' when nobody holds the table's stripes for long)."""
    if not holders:
        return ""
    named = "; ".join(LockHolder(**h).described() for h in holders)
    pids = ", ".join(str(h["pid"]) for h in holders)
    return (
        f"{table_name}: ordering locks held for long by {named}. Commits do not wait for them, but the keys of "
        f"those stripes are released only once they are let go: end the session if it is not one of yours "
        f"(SELECT pg_terminate_backend(pid) for {pids})."
    )
