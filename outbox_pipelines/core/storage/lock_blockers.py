"""Who a waiting migration statement waits for, and waiting for them to end without queuing in front of writes.

A second session asks ``pg_blocking_pids`` while the statement waits under its short lock timeout; after the
timeout the upgrade waits for exactly those transactions to end, then tries again at once: one short hold of the
application's writes per blocker instead of one per backoff. Why: docs/explanation/storage.md, "Upgrading beside
the application"."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.storage.connections import connect
from outbox_pipelines.core.storage.queries import shared_query

WATCH_APPLICATION_NAME = "outbox-pipelines db upgrade (lock watch)"
POLL_S = 0.05  # how often the watch asks while a statement waits; a lock timeout of 0.5 s gets ~9 looks
END_POLL_S = 0.2  # how often the upgrade looks whether the blockers' transactions have ended


@dataclass(frozen=True)
class Blocker:
    """A transaction a migration statement waited for; ``virtualxid`` names it until it ends (pg_locks)."""

    pid: int
    virtualxid: str
    application_name: str | None
    state: str | None
    xact_s: float | None  # None: this login may not see other logins' transaction times

    def describe(self) -> str:
        opened = "open for a time this login may not see" if self.xact_s is None else f"open {self.xact_s:.0f} s"
        application = self.application_name or "no application_name"
        return f"pid {self.pid} ({application}, {self.state or 'state hidden'}, {opened})"


def describe(blockers: dict[str, Blocker]) -> str:
    return "; ".join(blocker.describe() for blocker in blockers.values())


class BlockerWatch:
    """A session of its own (autocommit) that names what another session's statement waits for."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    @classmethod
    @contextmanager
    def open(cls, url: str) -> Iterator["BlockerWatch"]:
        with connect(url, autocommit=True, application_name=WATCH_APPLICATION_NAME) as conn:
            yield cls(conn)

    @contextmanager
    def watching(self, pid: int) -> Iterator[dict[str, Blocker]]:
        """While the block runs, collect the transactions session ``pid`` waits for (by virtualxid)."""
        found: dict[str, Blocker] = {}
        stop = threading.Event()

        def look() -> None:
            try:
                while not stop.wait(POLL_S):
                    for blocker in self._blockers_of(pid):
                        found.setdefault(blocker.virtualxid, blocker)
            except psycopg.Error:
                return  # the watch is a help, not a guarantee: without it the upgrade backs off as before

        thread = threading.Thread(target=look, name="outbox-migration-lock-watch", daemon=True)
        thread.start()
        try:
            yield found
        finally:
            stop.set()
            thread.join()

    def wait_for_end(self, blockers: dict[str, Blocker], until: float, clock: Callable[[], float]) -> bool:
        """True once every one of ``blockers`` has ended, False if one is still open at ``until`` (``clock``)."""
        while True:
            with self._conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(shared_query("migration_blockers_open"), {"virtualxids": list(blockers)}).fetchone()
            if row is None or row["open"] == 0:
                return True
            if clock() + END_POLL_S > until:
                return False
            time.sleep(END_POLL_S)

    def _blockers_of(self, pid: int) -> list[Blocker]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(shared_query("migration_blockers"), {"pid": pid}).fetchall()
        return [Blocker(r["pid"], r["virtualxid"], r["application_name"], r["state"], r["xact_s"]) for r in rows]
