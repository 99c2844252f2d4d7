"""The relay's second thread: heartbeats, and renews the leases of a batch whose dispatch runs long."""

import logging
import threading
import time
from collections.abc import Sequence

import psycopg

from outbox_pipelines.core.oncall import liveness
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.table import OutboxTable

log = logging.getLogger("outbox_pipelines.relay")


class LeaseKeeper:
    """Heartbeats for the relay, and renews the leases of the batch it holds.

    It has a connection of its own (the relay's is busy with the batch), survives any error
    (a database outage, a failed reconnect) by reconnecting on its next turn, and notices when
    the relay was declared dead meanwhile (``declared_dead``: the relay must stop claiming).
    """

    def __init__(
        self, url: str, table_name: str, worker: str, lease_s: float, heartbeat_s: float = liveness.HEARTBEAT_EVERY_S
    ) -> None:
        self.url, self.table_name, self.worker, self.lease_s = url, table_name, worker, lease_s
        self.interval = max(lease_s / 3.0, 0.05)
        self.heartbeat_s = heartbeat_s
        self.lost: set[int] = set()
        self.renewals = 0
        self.declared_dead = False
        self._held: list[tuple[int, int]] = []
        self._last = 0.0
        self._last_beat = time.monotonic()
        self._cond = threading.Condition()
        self._closed = False
        self._conn: psycopg.Connection | None = None
        self._thread = threading.Thread(target=self._run, name=f"outbox-lease-{table_name}", daemon=True)
        self._thread.start()

    def hold(self, held: Sequence[tuple[int, int]]) -> None:
        with self._cond:
            self._held = list(held)
            self._last = time.monotonic()
            self._cond.notify()

    def release(self) -> None:
        """Stop renewing: the batch is settled, or abandoned (its leases then expire and come back)."""
        with self._cond:
            self._held = []

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)
        if self._conn is not None:
            self._conn.close()

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = open_session(self.url)
        return self._conn

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(timeout=min(self.interval, self.heartbeat_s))
                if self._closed:
                    return
                held = list(self._held)
                due = bool(held) and time.monotonic() - self._last >= self.interval
            beat = time.monotonic() - self._last_beat >= self.heartbeat_s
            if not (due or beat):
                continue
            try:
                if beat:
                    self._beat()
                if due:
                    self._renew(held)
            except Exception as exc:  # noqa: BLE001 - any failure: drop the connection, try again next turn
                log.warning("relay %s: lease keeper could not reach the database: %s", self.table_name, exc)
                if self._conn is not None:
                    self._conn.close()
                self._conn = None

    def _beat(self) -> None:
        if not liveness.heartbeat(self._connection(), self.worker):
            if not self.declared_dead:
                log.error(
                    "relay %s: this relay (%s) was declared dead by the liveness sweep; stopping",
                    self.table_name,
                    self.worker,
                )
            self.declared_dead = True
        self._last_beat = time.monotonic()

    def _renew(self, held: list[tuple[int, int]]) -> None:
        renewed = OutboxTable(self._connection(), self.table_name).renew(self.worker, held, self.lease_s)
        with self._cond:
            if self._held != held:
                return  # released or replaced meanwhile: those leases are no longer ours to count
            self._last = time.monotonic()
        self.renewals += 1
        self.lost.update(h[0] for h in held if h[0] not in renewed)
