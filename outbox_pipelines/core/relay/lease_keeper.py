"""The relay's second thread: heartbeats, and renews the leases of a batch whose dispatch runs long."""

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg

from outbox_pipelines.core.relay import liveness
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables, bigint_array
from outbox_pipelines.core.storage.table_claims import id_runs

log = logging.getLogger("outbox_pipelines.relay")
Written = TypeVar("Written")


def runs_of(held: Sequence[tuple[int, int]]) -> tuple[list[int], list[int], list[int]]:
    """(id, attempts) pairs in id order as runs of consecutive ids at one attempt count (``id_runs``, the settle's
    rule): each run's first id, last id and attempts. A batch claimed in id order is one run or a few, so noting it
    costs one small row write whatever its size (1,000 ids one by one cost 2.7 µs a message, bench/results.md)."""
    first, last, attempts, _ = id_runs([row_id for row_id, _ in held], [attempt for _, attempt in held])
    return first, last, attempts


class LeaseKeeper:
    """Heartbeats for the relay, and renews the leases of the batch it holds.

    It has a connection of its own (the relay's is busy with the batch), survives any error
    (a database outage, a failed reconnect) by reconnecting on its next turn, and notices when
    the relay was declared dead meanwhile (``declared_dead``: the relay must stop claiming).
    """

    def __init__(
        self,
        url: str,
        table_name: str,
        worker: str,
        lease_s: float,
        renew_every_s: float,
        heartbeat_s: float = liveness.HEARTBEAT_EVERY_S,
    ) -> None:
        self.url, self.table_name, self.worker, self.lease_s = url, table_name, worker, lease_s
        self.interval = renew_every_s  # TableSettings.renew_every_s
        self.heartbeat_s = heartbeat_s
        self.lost: set[int] = set()
        self.renewals = 0
        self.declared_dead = False
        self._held: list[tuple[int, int]] = []
        # claim = "auto": what to do at ``_deadline`` (lease a held batch: relay/hold.py), unless cancelled first.
        self._deadline: float | None = None
        self._at_deadline: Callable[[], None] | None = None
        self._last = 0.0
        self._last_beat = time.monotonic()
        self._cond = threading.Condition()
        self._closed = False
        self._conn: psycopg.Connection | None = None
        # The connection is this thread's, and the relay's thread notes its held batches on it too.
        self._conn_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"outbox-lease-{table_name}", daemon=True)
        self._thread.start()

    def hold(self, held: Sequence[tuple[int, int]]) -> None:
        """Renew these leases from now on, ``interval`` after now. The thread is not woken: its wait already ends
        by then (``_run``), and a pipelined relay holds twice a batch (a wake-up each cost the relay's threads
        the GIL: bench/broker_paths.py)."""
        with self._cond:
            self._held = list(held)
            self._last = time.monotonic()

    def note_held(self, held: Sequence[tuple[int, int]]) -> None:
        """claim = "auto": note the batch the relay holds unwritten, with each row's attempts at the claim, on
        this keeper's connection (the relay's transaction commits only at the settle), so burying the relay
        if it dies mid-batch counts that attempt (liveness.bury). A failure is logged: the database is then
        unreachable, and the relay's own next statement fails and recovers."""
        starts, ends, attempts = runs_of(held)
        try:
            with self._conn_lock:
                SharedTables(self._connection()).note_held_batch(
                    self.worker, bigint_array(starts), bigint_array(ends), bigint_array(attempts)
                )
        except psycopg.Error as exc:
            log.warning("relay %s: could not note the batch it holds: %s", self.table_name, exc)

    def on_connection(self, work: Callable[[psycopg.Connection], Written]) -> Written:
        """Run ``work`` on this keeper's connection (a pipelined relay's settle: relay/pipeline.py), between its
        heartbeats and renewals. A lost connection is dropped, for the next turn to open anew, and raised."""
        with self._conn_lock:
            try:
                return work(self._connection())
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                raise

    def at(self, seconds: float, action: Callable[[], None]) -> None:
        """Run ``action`` on this thread in ``seconds``, unless ``cancel_at`` comes first."""
        with self._cond:
            self._deadline, self._at_deadline = time.monotonic() + seconds, action
            self._cond.notify()

    def cancel_at(self) -> None:
        with self._cond:
            self._deadline = self._at_deadline = None

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
        # Connected now, beside the relay's own start-up, instead of by the first batch's note (claim = "auto") or
        # settle (a pipelined destination) on the relay's thread; any failure is retried there (as below).
        with self._conn_lock, contextlib.suppress(Exception):
            self._connection()
        while True:
            with self._cond:
                if self._closed:
                    return
                wait_s = min(self.interval, self.heartbeat_s)
                renew_in = self._last + self.interval - time.monotonic()
                if self._held and renew_in > 0:  # overdue (a failed renewal): the next try an interval on
                    wait_s = min(wait_s, renew_in)
                if self._deadline is not None:
                    wait_s = min(wait_s, max(self._deadline - time.monotonic(), 0.0))
                if wait_s > 0:
                    self._cond.wait(timeout=wait_s)
                if self._closed:
                    return
                action = self._action_due()
                held = list(self._held)
                due = bool(held) and time.monotonic() - self._last >= self.interval
            if action is not None:
                action()  # outside the lock: it may hold() the batch it leased
                continue
            beat = time.monotonic() - self._last_beat >= self.heartbeat_s
            if not (due or beat):
                continue
            with self._conn_lock:
                try:
                    if beat:
                        self._beat()
                    if due:
                        self._renew(held)
                except Exception as exc:  # any failure: drop the connection, try again next turn
                    log.warning("relay %s: lease keeper could not reach the database: %s", self.table_name, exc)
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None

    def _action_due(self) -> Callable[[], None] | None:
        """The deadline's action once it is due (taken: it runs once). Called under the lock."""
        if self._deadline is None or time.monotonic() < self._deadline:
            return None
        action, self._deadline, self._at_deadline = self._at_deadline, None, None
        return action

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
