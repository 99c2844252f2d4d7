"""One claimed batch, start to end: plan what to send, deliver it, settle what happened, count it."""

import time

from outbox_pipelines.core import tracing
from outbox_pipelines.core.destination_health import DestinationGuard
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay.counting import count_settled_batch
from outbox_pipelines.core.relay.dispatch import (
    DispatchPlan,
    combine_outcomes,
    deliver_planned,
    plan_dispatch,
)
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.relay.pause import Pause
from outbox_pipelines.core.relay.report import RelayReport
from outbox_pipelines.core.relay.settlement import (
    plan_settlement,
    settle_batch,
    settle_row_by_row,
)
from outbox_pipelines.core.retry import UniformSource
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.table import OutboxTable, Settlement


def held(batch: list[ClaimedMessage]) -> list[tuple[int, int]]:
    """The leases a batch holds: (id, attempt) — the attempt is the fencing token."""
    return [(msg.id, msg.attempts) for msg in batch]


class BatchRunner:
    def __init__(self, table: TableSettings, destination: Destination, worker: str, guard: DestinationGuard,
                 pause: Pause, uniform: UniformSource) -> None:
        self.table, self.destination, self.worker = table, destination, worker
        self.guard, self.pause, self.uniform = guard, pause, uniform
        # When each claimed message was claimed (time.monotonic()), for the dispatch latency metric.
        self.claimed_at: dict[int, float] = {}
        # A transaction costs round trips on every batch: only a destination that records something
        # beside the settle (the order ledger) needs its after_settle to share one with the settle.
        self._after_settle_in_transaction = type(destination).after_settle is not Destination.after_settle

    def note_claimed(self, batch: list[ClaimedMessage]) -> None:
        mono = time.monotonic()
        for message in batch:
            self.claimed_at[message.id] = mono

    def forget_claims(self) -> None:
        """The batches in flight were abandoned (a database error): none of them will be settled here."""
        self.claimed_at.clear()

    def plan(self, store: OutboxTable, batch: list[ClaimedMessage]) -> DispatchPlan:
        return plan_dispatch(store, batch, self.table.dedup)

    def deliver(self, batch: list[ClaimedMessage], plan: DispatchPlan) -> list[Outcome]:
        """No database work here: this may run on the pipeline thread."""
        return deliver_planned(self.destination, self.table.name, batch, plan)

    def run(self, store: OutboxTable, keeper: LeaseKeeper, batch: list[ClaimedMessage], report: RelayReport) -> None:
        """One batch, start to end, on this thread: plan, deliver, settle."""
        keeper.hold(held(batch))
        try:
            plan = self.plan(store, batch)
            outcomes = combine_outcomes(plan, self.deliver(batch, plan))
        finally:
            keeper.release()
        self.finish(store, batch, outcomes, report)

    def finish(self, store: OutboxTable, batch: list[ClaimedMessage], outcomes: list[Outcome],
               report: RelayReport) -> None:
        """Record what the destination did, settle the batch, count what happened."""
        self.guard.observe(store.conn, outcomes)  # first: a batch that opens the circuit spends no attempts
        settlements = [plan_settlement(msg, out, self.table, self.uniform, circuit_open=self.guard.circuit_open)
                       for msg, out in zip(batch, outcomes)]
        with tracing.tracer().start_as_current_span(
                "outbox.settle", attributes={"outbox.table": self.table.name, "outbox.batch": len(batch)}):
            settled = self._settle(store, batch, settlements, report)
        counts = count_settled_batch(self.table.name, batch, settlements, outcomes, settled, self.claimed_at,
                                     report.lag)
        report.add_batch(counts)
        if counts.slow_down_s > 0:
            # 429: the destination is overloaded; hold the whole table, in every relay of it, not just this row.
            self.pause.hold(counts.slow_down_s, "the destination answered 429")
            self.guard.pause(store.conn, counts.slow_down_s, "429 Retry-After")

    def _settle(self, store: OutboxTable, batch: list[ClaimedMessage], settlements: list[Settlement],
                report: RelayReport) -> set[int]:
        if not self._after_settle_in_transaction:
            return self._write(store, settlements, report)
        # The destination records results elsewhere (the order ledger) in the same transaction.
        with store.conn.transaction():
            settled = self._write(store, settlements, report)
            self.destination.after_settle(store.conn, [(msg, s) for msg, s in zip(batch, settlements)
                                                       if s.id in settled])
        return settled

    def _write(self, store: OutboxTable, settlements: list[Settlement], report: RelayReport) -> set[int]:
        settled = settle_batch(store, self.worker, settlements, self.table.name)
        if settled is None:
            report.db_errors += 1
            settled = settle_row_by_row(store, self.worker, settlements)
        return settled
