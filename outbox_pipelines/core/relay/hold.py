"""A batch held in the relay's transaction (claim = "transaction", and "auto" while its dispatch lasts).

Its rows are locked, nothing written, and settled in that transaction. Under "auto", a batch still in dispatch at
``hold`` is leased by the lease keeper's thread (sending, holder, attempt counted) and committed, and then settles
as a leased batch. The relay's connection is used by one thread at a time: the keeper leases only while the
relay's thread is in the destination, and whoever moves the batch out of ``held`` first, under the lock, decides.
"""

import contextlib
import threading
from collections.abc import Callable
from enum import Enum

import psycopg

from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay.batch import BatchRunner, held
from outbox_pipelines.core.relay.dispatch import combine_outcomes
from outbox_pipelines.core.relay.invocation import Invocation
from outbox_pipelines.core.relay.lanes import HeldLanes, SettleFailed
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.table import OutboxTable


class HoldState(Enum):
    HELD = "held"  # locked by the relay's open transaction
    LEASED = "leased"  # leased and committed by the keeper: settle as a leased batch
    SETTLING = "settling"  # the relay settles it in its transaction: the keeper must not touch it
    FAILED = "failed"  # the lease could not be written (the connection failed): the relay raises it


class HeldBatch:
    def __init__(self, lease: Callable[[], None]) -> None:
        self._lease = lease
        self._lock = threading.Lock()
        self.state = HoldState.HELD
        self.error: BaseException | None = None

    def lease_now(self) -> None:
        """On the keeper's thread, at ``hold``: lease the batch and commit, unless its relay settles it already."""
        with self._lock:
            if self.state is not HoldState.HELD:
                return
            try:
                self._lease()
            except BaseException as exc:  # handed to the relay's thread, which settles or recovers
                self.error = exc
                self.state = HoldState.FAILED
            else:
                self.state = HoldState.LEASED

    def settle_held(self) -> bool:
        """On the relay's thread, once delivered: True if the batch is still held (the relay settles it in its
        transaction; the keeper will leave it alone), False if it was leased. Raises what leasing it raised."""
        with self._lock:
            if self.state is HoldState.HELD:
                self.state = HoldState.SETTLING
                return True
            if self.error is not None:
                raise self.error
            return False


def hold_seconds(table: TableSettings) -> float:
    """How long a batch stays held before its lease is written: ``hold``, but never past a third of the
    lease, so the server (which ends a held transaction idle for ``lease``) never cuts it first."""
    return min(table.hold_s, table.lease_s / 3.0)


def _end_empty(lane: OutboxTable) -> None:
    """The transaction of a claim that took nothing: kept when it marked rows waiting behind their keys' heads (a
    probe the gate took in it goes too), else rolled back."""
    if lane.left_waiting or lane.contended_keys:
        lane.conn.commit()
    else:
        lane.conn.rollback()


def relay_held_first(
    run: Invocation,
    table: TableSettings,
    batches: BatchRunner,
    worker: str,
    claim_next: Callable[[], list[ClaimedMessage]],
    claimed: list[ClaimedMessage],
    lanes: HeldLanes,
) -> None:
    """One held batch: claimed in a transaction of the relay's session (``claim_next`` claims held rows), dispatched
    on this thread, then settled in that transaction. Under claim = "auto" it is also noted on the relay's worker
    row (a relay that dies holding it has its attempt counted) and, once the keeper leased it at ``hold``, settled
    as a leased batch. ``claimed`` receives the batch as soon as it is claimed, so a database error's recovery
    knows which batch it abandoned. A full batch delivered whole commits behind, while the next is claimed on the
    other connection of ``lanes`` (relay/lanes.py); the batch before it has committed before this one is sent."""
    lane = run.outbox_table
    conn = lane.conn
    conn.execute("BEGIN")  # committed by the settle, or by the keeper when it leases the batch
    try:
        batch = claim_next()
        claimed.extend(batch)
        if not batch:
            _end_empty(lane)
            return
        ahead = len(batch) >= table.batch_size and lanes.alone(lane)
        if ahead:  # a backlog, and no other relay of the table claims while this one settles
            lanes.open_spare()
        noted = table.claim == "auto"
        if noted:  # while the batch before commits, on the keeper's connection: the two overlap
            run.keeper.note_held([(msg.id, msg.attempts - 1) for msg in batch])  # attempts: as the rows have them
        try:
            lanes.settled()  # the batch before has committed: its dedup keys, circuit and pause are known
        except BaseException as exc:
            if noted:
                run.keeper.note_held([])  # never sent: burying the relay must not count its attempt
            if isinstance(exc, SettleFailed):
                run.report.claimed -= len(batch)  # given back untouched: none of it spent from the budget
                batches.forget(batch)
            raise
        plan = batches.plan(lane, batch)

        def settle_held(outcomes: list[Outcome]) -> None:
            """In this transaction: now, or behind while the next batch is claimed, for a full batch of the table's
            only relay (the next claim follows at once) delivered whole (nothing the next batch must wait for)."""

            def commit() -> None:
                batches.finish(lane, batch, outcomes, run.report, held=True)
                conn.commit()

            if not (ahead and batches.delivered_plainly(outcomes) and lanes.settle_behind(run, batch, commit)):
                commit()

        if not noted:  # claim = "transaction": no lease, no note; the server ends a hung transaction
            settle_held(combine_outcomes(plan, batches.deliver(batch, plan)))
            return

        def lease() -> None:  # on the keeper's thread, at `hold`
            lane.lease_held(
                worker,
                [msg.id for msg in batch],
                table.lease_s,
                claimed_at=batch[0].claimed_at,
                audit_claims=table.audit == "all",
            )
            conn.commit()
            run.report.leased_after_hold += 1
            run.keeper.hold(held(batch))

        hold = HeldBatch(lease)
        run.keeper.at(hold_seconds(table), hold.lease_now)
        try:
            outcomes = combine_outcomes(plan, batches.deliver(batch, plan))
        finally:
            run.keeper.cancel_at()
        if hold.settle_held():
            settle_held(outcomes)
        else:
            run.keeper.release()
            batches.finish(lane, batch, outcomes, run.report, held=False)
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()  # a held batch goes back as it was; a leased one is given back by the caller
        raise
