"""Held batches in turns on two connections: a full batch delivered whole commits on its own while the next is claimed.

The settle thread settles and commits batch N on N's connection while the relay's thread claims N+1 on the other
(its rows stay locked until then, so SKIP LOCKED and the key-head check keep the order, as between two relays).
N+1 is dispatched only once N has committed, so a failed settle gives N+1 back untouched. Why:
docs/explanation/relay.md, "Claim modes".
"""

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg

from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.relay import liveness, ordering
from outbox_pipelines.core.relay.invocation import Invocation
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.shared_tables import SharedTables
from outbox_pipelines.core.storage.table import OutboxTable

log = logging.getLogger("outbox_pipelines.relay")
# How often a relay that fills its batches asks whether it is its table's only relay.
PEERS_EVERY_S = 1.0


class SettleFailed(Exception):
    """The settle of a batch committed behind lost its connection: ``batch`` was not settled (its rows are
    pending again, as the server rolled its transaction back), and ``error`` says why."""

    def __init__(self, batch: list[ClaimedMessage], error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.batch, self.error = batch, error


class HeldLanes:
    """The relay's session and a spare connection, opened at the first full batch and closed at the end."""

    def __init__(self, url: str, table_name: str) -> None:
        self.url, self.table_name = url, table_name
        self._thread: ThreadPoolExecutor | None = None
        self._spare: Future[OutboxTable | None] | None = None
        self._home: OutboxTable | None = None
        self._settling: Future[None] | None = None
        self._settling_on: OutboxTable | None = None
        self._settling_batch: list[ClaimedMessage] = []
        self._alone, self._peers_asked = False, float("-inf")

    @property
    def settling(self) -> bool:
        return self._settling is not None

    def busy(self, conn: psycopg.Connection) -> bool:
        """Whether a settle is in flight on ``conn`` (no other statement may go on it meanwhile)."""
        return self._settling_on is not None and self._settling_on.conn is conn

    def alone(self, outbox_table: OutboxTable) -> bool:
        """Whether this is its table's only live relay (asked at most every PEERS_EVERY_S). Only then does it claim
        ahead: competing relays already claim while one settles, and a second claimer each cost 4 relays on 2 cores
        a third of their drain (bench/results.md)."""
        now = time.monotonic()
        if now - self._peers_asked >= PEERS_EVERY_S:
            alive = SharedTables(outbox_table.conn).relays_alive([self.table_name], within_s=liveness.SILENT_AFTER_S)
            self._alone, self._peers_asked = alive.get(self.table_name, 0) <= 1, now
        return self._alone

    def open_spare(self) -> None:
        """A full batch: a backlog. The spare connection is opened on the settle thread during its dispatch."""
        if self._spare is None:
            self._spare = self._pool().submit(self._open_spare)

    def _open_spare(self) -> OutboxTable | None:
        try:
            return OutboxTable(open_session(self.url), self.table_name)
        except Exception as exc:  # the relay goes on settling each batch before the next claim
            log.warning("relay %s: no second connection (%s); each batch settles first", self.table_name, exc)
            return None

    def settle_behind(self, run: Invocation, batch: list[ClaimedMessage], settle: Callable[[], None]) -> bool:
        """Hand ``settle`` (the held batch's settle and commit on ``run.outbox_table``'s connection) to the settle
        thread and point the run at the other connection. False: no spare connection, the caller settles."""
        spare = self._spare_table()
        if spare is None or self._settling is not None:
            return False
        lane = run.outbox_table
        if lane.conn is run.session.conn:
            self._home = lane
        other = spare if lane is not spare else self._home_of(run)

        def settle_and_release() -> None:
            try:
                settle()
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    if not lane.conn.closed:
                        lane.conn.rollback()
                raise
            if lane.contended_keys:  # once its transaction is over, as the relay's turn does (ordering.py)
                ordering.release_contended(lane, patient=False)

        self._settling, self._settling_on, self._settling_batch = self._pool().submit(settle_and_release), lane, batch
        run.outbox_table = other
        return True

    def settled(self) -> None:
        """Wait for the settle in flight. A lost connection raises ``SettleFailed``; anything else, itself."""
        settling, lane, batch = self._settling, self._settling_on, self._settling_batch
        self._settling, self._settling_on, self._settling_batch = None, None, []
        if settling is None:
            return
        try:
            settling.result()
        except psycopg.OperationalError as exc:
            if lane is not None and self._spare is not None and lane is self._spare_table():
                self._drop_spare()
            raise SettleFailed(batch, exc) from exc

    def go_home(self, run: Invocation) -> None:
        """Settled, and back on the relay's session (it LISTENs, and the keys left contended are released there)."""
        self.settled()
        self._back_home(run)

    def abandon(self, run: Invocation) -> list[ClaimedMessage]:
        """The invocation ends or reconnects: wait for the settle in flight, drop the spare, and point the run at its
        session. The batch whose settle failed on a lost connection, if one did (what else it raised is logged)."""
        failed: list[ClaimedMessage] = []
        try:
            self.settled()
        except SettleFailed as exc:
            failed = exc.batch
        except Exception as exc:  # the caller is already handling an error, or ending
            log.warning("relay %s: the settle in flight failed: %s", self.table_name, exc)
        self._back_home(run)
        self._drop_spare()
        self._home, self._peers_asked = None, float("-inf")
        return failed

    def shutdown(self) -> None:
        self._drop_spare()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _back_home(self, run: Invocation) -> None:
        """The run on its session, with the keys both connections still have to release (a claim on the spare marks
        keys too, and the spare may be dropped next)."""
        home = run.outbox_table if run.outbox_table.conn is run.session.conn else self._home_of(run)
        spare = self._spare_table() if self._spare is not None and self._spare.done() else None
        for lane in (run.outbox_table, spare):
            if lane is not None and lane is not home and lane.contended_keys:
                home.contended_keys.update(lane.contended_keys)
                lane.contended_keys.clear()
        run.outbox_table = home

    def _home_of(self, run: Invocation) -> OutboxTable:
        if self._home is None or self._home.conn is not run.session.conn:
            self._home = OutboxTable(run.session.conn, self.table_name)
        return self._home

    def _pool(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"outbox-settle-held-{self.table_name}")
        return self._thread

    def _spare_table(self) -> OutboxTable | None:
        """The spare, once open; None if it could not be opened (logged once: the relay settles in line)."""
        if self._spare is None:
            return None
        spare = self._spare.result()
        return None if spare is None or spare.conn.closed else spare

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.add_done_callback(_close_opened)  # at once if it is done


def _close_opened(opened: "Future[OutboxTable | None]") -> None:
    table = opened.result()
    if table is not None:
        table.conn.close()
