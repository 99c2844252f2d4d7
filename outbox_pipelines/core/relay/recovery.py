"""The relay's connection after a database error, and at the end: reconnecting, giving back what it held, the goodbye.

After a lost connection or a statement timeout (``Relay._recover`` in relay/loop.py), ``Recovery`` reconnects with a
backoff, retakes the single-active lock, audits the error and gives back every row the relay still holds. The
goodbye lets go of the lock and records the stop whatever state the connection is in.
"""

import logging

import psycopg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import ClaimedMessage, cap_error
from outbox_pipelines.core.relay import liveness, single_active
from outbox_pipelines.core.relay.invocation import Invocation
from outbox_pipelines.core.relay.session import RelaySession, open_relay_session, open_session
from outbox_pipelines.core.relay.stop import StopReason, StopRequest
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.table import OutboxTable

log = logging.getLogger("outbox_pipelines.relay")

# Far past any lease: after a database error, every row this relay still holds counts as stuck.
_ALL_HELD_S = 10 * 365 * 86400.0


class Recovery:
    def __init__(self, url: str, direct_url: str | None, table: TableSettings, worker: str, stop: StopRequest) -> None:
        self.url, self.direct_url, self.table, self.worker, self.stop = url, direct_url, table, worker, stop

    def reconnect(self, run: Invocation) -> RelaySession | None:
        """A fresh session (holding the single-active lock again if the table has one), or None: the
        invocation ends, and ``stopped_because`` says why."""
        run.conn.close()
        report, delay = run.report, 0.1
        while not self.stop.requested:
            if run.budget.out_of_time():
                report.stopped_because = StopReason.UNREACHABLE_PAST_BUDGET
                return None
            try:
                new = open_relay_session(self.url, self.table, self.direct_url)
            except Exception as exc:  # any failure to connect: try again after a backoff
                log.warning("relay %s: reconnect failed (%s); retrying in %.1fs", self.table.name, exc, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            if run.single_active and not single_active.try_lock(OutboxTable(new.conn, self.table.name)):
                report.lock_held = False
                report.stopped_because = StopReason.LOCK_LOST
                new.conn.close()
                return None
            return new
        report.stopped_because = StopReason.STOP_REQUESTED
        return None

    def audit_db_problem(self, outbox_table: OutboxTable, batch: list[ClaimedMessage], exc: BaseException) -> None:
        code = m.AUDIT_DB_TIMEOUT if isinstance(exc, psycopg.errors.QueryCanceled) else m.AUDIT_DB_ERROR
        try:
            # With no batch yet (the claim itself failed): one row about the table, no message id.
            outbox_table.audit_messages(
                [msg.id for msg in batch],
                code=code,
                error_code=type(exc).__name__,
                worker=self.worker,
                detail=cap_error(str(exc)),
            )
        except psycopg.Error:
            log.warning("relay %s: could not audit %s", self.table.name, code)

    def give_back_held(self, run: Invocation) -> None:
        """After a database error: rows this relay still holds (a batch it could not settle, a claim whose
        answer was lost) go back to pending now, so none strands until its lease expires. Their attempt
        stays counted: they may have been delivered, and will be again (the idempotency key makes it once)."""
        try:
            rows = run.outbox_table.requeue_stuck(
                self.worker,
                stuck_after_s=_ALL_HELD_S,
                max_attempts=self.table.retry.max_attempts,
                dead_holder=self.worker,
                pass_over_dead=self.table.ordering == "skip",
            )
        except psycopg.Error as exc:
            log.warning("relay %s: could not give back the rows it held: %s", self.table.name, exc)
            return
        mine = sum(1 for r in rows if r["previous_holder"] == self.worker)
        if mine:
            log.warning("relay %s: gave back %d rows held when the database failed", self.table.name, mine)
        run.report.requeued += sum(1 for r in rows if r["status"] == m.MessageState.PENDING)

    def say_goodbye(self, conn: psycopg.Connection, unlock: bool, reason: str) -> None:
        """Let go of the single-active lock and record the stop, so nobody takes this relay for dead."""
        for _ in range(2):
            try:
                if conn.closed:
                    conn = open_session(self.url)
                if unlock:
                    single_active.unlock(OutboxTable(conn, self.table.name))
                liveness.stopped(conn, self.worker, reason)
                break
            except Exception as exc:  # a stop must always finish
                log.warning("relay %s: could not record its stop (%s)", self.table.name, exc)
                conn.close()
                unlock = False  # a fresh session holds no lock
        conn.close()
