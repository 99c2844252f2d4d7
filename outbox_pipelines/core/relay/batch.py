"""One claimed batch, start to end: plan what to send, deliver it, settle what happened, count it."""

import time
from contextlib import AbstractContextManager, nullcontext

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay.counting import count_delivered_batch, count_settled_batch
from outbox_pipelines.core.relay.destination_health import CIRCUIT_WAIT, DestinationGuard
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
    plainly_sent,
    plan_settlement,
    settle_batch,
    settle_delivered,
    settle_row_by_row,
)
from outbox_pipelines.core.retry import UniformSource
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.table import OutboxTable, Settlement
from outbox_pipelines.core.telemetry import tracing
from outbox_pipelines.core.telemetry.counts import TableRelayMetrics


def held(batch: list[ClaimedMessage]) -> list[tuple[int, int]]:
    """The leases a batch holds: (id, attempt) — the attempt is the fencing token."""
    return [(msg.id, msg.attempts) for msg in batch]


def _settled_pairs(
    batch: list[ClaimedMessage], settlements: list[Settlement], settled: set[int]
) -> list[tuple[ClaimedMessage, Settlement]]:
    """Each settled message with how it ended (a row whose lease was lost is not this relay's to report)."""
    # One settlement per message, planned from the batch itself.
    return [(msg, s) for msg, s in zip(batch, settlements, strict=True) if s.id in settled]


class BatchRunner:
    def __init__(
        self,
        table: TableSettings,
        destination: Destination,
        worker: str,
        guard: DestinationGuard,
        pause: Pause,
        uniform: UniformSource,
    ) -> None:
        self.table, self.destination, self.worker = table, destination, worker
        self.guard, self.pause, self.uniform = guard, pause, uniform
        self._after_settle_overridden = type(destination).after_settle is not Destination.after_settle
        # When each claimed batch was claimed (time.monotonic()), by its first id, for the dispatch latency metric.
        self.claimed_at: dict[int, float] = {}
        self.metrics = TableRelayMetrics(table.name, destination.messaging_system)

    def note_claimed(self, batch: list[ClaimedMessage]) -> None:
        if batch:
            self.claimed_at[batch[0].id] = time.monotonic()

    def forget(self, batch: list[ClaimedMessage]) -> float | None:
        """When the batch was claimed (None: unknown); it is not remembered any longer."""
        return self.claimed_at.pop(batch[0].id, None) if batch else None

    def forget_claims(self) -> None:
        """The batches in flight were abandoned (a database error): none of them will be settled here."""
        self.claimed_at.clear()

    def plan(self, outbox_table: OutboxTable, batch: list[ClaimedMessage]) -> DispatchPlan:
        return plan_dispatch(outbox_table, batch, self.table.dedup, self.table.retry.max_attempts)

    def deliver(self, batch: list[ClaimedMessage], plan: DispatchPlan) -> list[Outcome]:
        """No database work here: this may run on the pipeline thread."""
        started = time.perf_counter()
        outcomes = deliver_planned(self.destination, self.table.name, batch, plan)
        if outcomes:  # the destination was called
            self.metrics.operation.observe(time.perf_counter() - started)
        return outcomes

    def run(
        self, outbox_table: OutboxTable, keeper: LeaseKeeper, batch: list[ClaimedMessage], report: RelayReport
    ) -> None:
        """One leased batch, start to end, on this thread: plan, deliver, settle (a held one: relay/hold.py)."""
        keeper.hold(held(batch))
        try:
            plan = self.plan(outbox_table, batch)
            outcomes = combine_outcomes(plan, self.deliver(batch, plan))
        finally:
            keeper.release()
        self.finish(outbox_table, batch, outcomes, report, held=False)

    def finish(
        self,
        outbox_table: OutboxTable,
        batch: list[ClaimedMessage],
        outcomes: list[Outcome],
        report: RelayReport,
        *,
        held: bool,
    ) -> None:
        """Record what the destination did, settle the batch, count what happened."""
        claimed_mono = self.forget(batch)
        if self.delivered_plainly(outcomes):
            # The common batch, delivered whole: settled and counted without a plan per message. Its success is
            # recorded after the settle, so a held batch's settle is its transaction's first write (settlement.py).
            with self._settle_span(batch), self.metrics.settle.time():
                settled = settle_delivered(outbox_table, self.worker, batch, outcomes, self.table, held=held)
            self._observe(outbox_table, outcomes)
            if settled is not None and len(settled) == len(batch):
                counts = count_delivered_batch(self.table.name, batch, claimed_mono, report.lag, self.metrics)
                report.add_batch(counts)
                return
            settlements = self._plan(batch, outcomes)
            if settled is None:
                settled = self._settle_refused(outbox_table, settlements, report, held)
        else:
            self._observe(outbox_table, outcomes)  # first: a batch that opens the circuit spends no attempts
            settlements = self._plan(batch, outcomes)
            with self._settle_span(batch), self.metrics.settle.time():
                settled = self._settle(outbox_table, batch, settlements, report, held)
        counts = count_settled_batch(
            self.table.name, batch, settlements, outcomes, settled, claimed_mono, report.lag, self.metrics
        )
        report.add_batch(counts)
        if counts.slow_down_s > 0:
            # 429: the destination is overloaded; hold the whole table, in every relay of it, not just this row.
            self.pause.hold(counts.slow_down_s, "the destination answered 429")
            self.guard.pause(outbox_table.conn, counts.slow_down_s, "429 Retry-After")

    def _observe(self, outbox_table: OutboxTable, outcomes: list[Outcome]) -> None:
        """The destination's health: a failure counts towards the circuit, a success closes it."""
        was_open = self.guard.circuit_open
        self.guard.observe(outbox_table.conn, outcomes)
        if was_open and not self.guard.circuit_open and self.pause.reason == CIRCUIT_WAIT:
            # The probe succeeded. A pipelined relay claimed ahead while it was in flight, found the circuit
            # open and paused until the next probe: that wait is over, the rest goes now.
            self.pause.lift()

    def delivered_plainly(self, outcomes: list[Outcome]) -> bool:
        """Whether ``settle_delivered`` can settle the batch: rows marked sent, and no after_settle to tell."""
        return self.table.on_success == "mark_sent" and not self._after_settle_overridden and plainly_sent(outcomes)

    def _plan(self, batch: list[ClaimedMessage], outcomes: list[Outcome]) -> list[Settlement]:
        return [
            plan_settlement(msg, out, self.table, self.uniform, circuit_open=self.guard.circuit_open)
            for msg, out in zip(batch, outcomes, strict=True)
        ]

    def _settle_span(self, batch: list[ClaimedMessage]) -> AbstractContextManager[object]:
        return tracing.span("outbox.settle", {"outbox.table": self.table.name, "outbox.batch": len(batch)})

    def _settle(
        self,
        outbox_table: OutboxTable,
        batch: list[ClaimedMessage],
        settlements: list[Settlement],
        report: RelayReport,
        held: bool,
    ) -> set[int]:
        # A transaction costs round trips on every batch: only a destination whose after_settle writes
        # (the order ledger) shares one with the settle. A held batch is in the relay's transaction already.
        shared = self.destination.writes_on_settle and not held
        scope = outbox_table.conn.transaction() if shared else nullcontext()
        with scope:
            claimed_at = batch[0].claimed_at if batch else None
            settled = settle_batch(outbox_table, self.worker, settlements, self.table, held=held, claimed_at=claimed_at)
            if settled is None:
                settled = self._settle_refused(outbox_table, settlements, report, held)
            self.destination.after_settle(outbox_table.conn, _settled_pairs(batch, settlements, settled))
        return settled

    def _settle_refused(
        self, outbox_table: OutboxTable, settlements: list[Settlement], report: RelayReport, held: bool
    ) -> set[int]:
        """The database refused the batch's statement: row by row, so one row cannot hold the rest back."""
        report.db_errors += 1
        return settle_row_by_row(outbox_table, self.worker, settlements, self.table, held=held)
