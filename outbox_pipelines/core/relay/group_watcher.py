"""A relay group's watcher: one connection that wakes the group's quiet tables when they have work.

It LISTENs on the quiet tables' channels only (an enqueue wakes its table at once) and asks, every ``poll_s``
and in one statement, which quiet tables have rows that became due (a retry's backoff, a replay, a requeue).
It outlives any database error: it reconnects, backing off, until the group stops (relay/group.py).
"""

import logging
import threading

import psycopg
from psycopg import sql

from outbox_pipelines.core.errors import OutboxError
from outbox_pipelines.core.names import notify_channel
from outbox_pipelines.core.relay.group_tables import TableWorker
from outbox_pipelines.core.relay.stop import StopRequest
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import ready_tables

log = logging.getLogger("outbox_pipelines.relay")


class Watcher:
    def __init__(
        self, url: str, group: str, workers: dict[str, TableWorker], *, poll_s: float, stop: StopRequest
    ) -> None:
        self.url, self.group, self.workers, self.poll_s, self.stop = url, group, workers, poll_s, stop
        self._listening: set[str] = set()

    def start(self) -> threading.Thread:
        conn = self._listen()  # in the caller's thread: a group that cannot connect fails now, not later
        thread = threading.Thread(target=self._watch, args=(conn,), daemon=True, name=f"outbox-group-{self.group}")
        thread.start()
        return thread

    def _listen(self) -> psycopg.Connection:
        conn = connect(self.url)
        self._listening = set()
        self._follow(conn)
        return conn

    def _follow(self, conn: psycopg.Connection) -> None:
        """LISTEN on the quiet tables' channels only: an active table's relay LISTENs on its own, and a busy
        table's every NOTIFY would otherwise wake this thread too (hundreds a second, each a GIL hand-off)."""
        for name, worker in self.workers.items():
            quiet = not (worker.left_out or worker.active)
            if quiet != (name in self._listening):
                verb = "LISTEN" if quiet else "UNLISTEN"
                conn.execute(sql.SQL(verb + " {}").format(sql.Identifier(notify_channel(name))))
                (self._listening.add if quiet else self._listening.discard)(name)

    def _watch(self, conn: psycopg.Connection) -> None:
        """Wake a quiet table on its NOTIFY at once, and on rows that became due within poll_s (which also finds
        a message committed while its table went quiet, before its channel was listened to again)."""
        channels = {notify_channel(name): worker for name, worker in self.workers.items()}
        while not self.stop.requested:
            try:
                for note in conn.notifies(timeout=self.poll_s):
                    worker = channels.get(note.channel)
                    if worker is not None and not worker.active:
                        worker.wake.set()
                    if self.stop.requested:
                        break
                self._follow(conn)
                self._wake_the_due(conn)
            except Exception as exc:  # the watcher wakes every table: it must outlive any error
                log.warning("relay group %s: its watcher lost the database (%s); reconnecting", self.group, exc)
                conn.close()
                fresh = self._reconnect()
                if fresh is None:
                    return
                conn = fresh
        conn.close()

    def _wake_the_due(self, conn: psycopg.Connection) -> None:
        quiet = {
            name: tuple(worker.settings.paused_topics) + tuple(worker.destination.paused_topics)
            for name, worker in self.workers.items()
            if not (worker.left_out or worker.active or worker.wake.is_set()) and worker.destination is not None
        }
        for name in ready_tables(conn, quiet):
            self.workers[name].wake.set()

    def _reconnect(self) -> psycopg.Connection | None:
        delay = 0.5
        while not self.stop.wait(delay):
            try:
                return self._listen()
            except (psycopg.Error, OutboxError):  # DatabaseUnavailable while it is away
                delay = min(delay * 2, 10.0)
        return None
