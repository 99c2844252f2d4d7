"""Pipelined delivery: deliver batch N on a thread of its own while claiming N+1.

A batch delivered whole lets the next go on the wire at once and is settled while it is in flight; any other
batch is settled first, so an outage or a 429 is known before more is sent. At most two batches are
delivered-but-unrecorded per relay. Why: docs/explanation/relay.md, "Claim, dispatch, settle".
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay.batch import BatchRunner, held
from outbox_pipelines.core.relay.dispatch import DispatchPlan, combine_outcomes
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.relay.report import RelayReport
from outbox_pipelines.core.relay.settlement import plainly_sent
from outbox_pipelines.core.storage.table import OutboxTable


class Pipeline:
    def __init__(self, batches: BatchRunner) -> None:
        self.batches = batches
        self._thread: ThreadPoolExecutor | None = None
        self._in_flight: Future[list[Outcome]] | None = None

    def run(
        self,
        outbox_table: OutboxTable,
        keeper: LeaseKeeper,
        first: list[ClaimedMessage],
        report: RelayReport,
        claim_next: Callable[[], list[ClaimedMessage]],
    ) -> None:
        """Relay ``first`` and the batches ``claim_next`` gives, until it gives none (no ready rows, a budget,
        a stop or a 429 pause); every batch in flight is settled before this returns."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"outbox-deliver-{self.batches.table.name}")
        plan = self.batches.plan(outbox_table, first)
        self._in_flight = self._thread.submit(self.batches.deliver, first, plan)
        keeper.hold(held(first))
        try:
            self._loop(outbox_table, keeper, first, plan, report, claim_next)
        except BaseException:
            # Nothing may be given back while it is still on the wire: wait for the delivery in flight.
            wait([self._in_flight])
            raise

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _loop(
        self,
        outbox_table: OutboxTable,
        keeper: LeaseKeeper,
        current: list[ClaimedMessage],
        plan: DispatchPlan,
        report: RelayReport,
        claim_next: Callable[[], list[ClaimedMessage]],
    ) -> None:
        assert self._thread is not None and self._in_flight is not None
        while True:
            upcoming = claim_next()
            if upcoming:
                keeper.hold(held(current + upcoming))
            outcomes = combine_outcomes(plan, self._in_flight.result())
            if upcoming and plainly_sent(outcomes) and not self._must_wait():
                # Delivered whole: the next batch goes on the wire now, and this one is settled meanwhile.
                next_plan = self.batches.plan(outbox_table, upcoming)
                self._in_flight = self._thread.submit(self.batches.deliver, upcoming, next_plan)
                self.batches.finish(outbox_table, current, outcomes, report, held=False)
                keeper.hold(held(upcoming))
                current, plan = upcoming, next_plan
                continue
            # Anything else is settled before the next batch goes on the wire: a failure that opens the
            # circuit or a 429 holds back the batch claimed ahead.
            self.batches.finish(outbox_table, current, outcomes, report, held=False)
            if upcoming and self._must_wait():
                self._release_unsent(outbox_table, upcoming, report)
                upcoming = []
            if not upcoming:
                keeper.release()
                return
            plan = self.batches.plan(outbox_table, upcoming)
            self._in_flight = self._thread.submit(self.batches.deliver, upcoming, plan)
            keeper.hold(held(upcoming))
            current = upcoming

    def _must_wait(self) -> bool:
        """A 429 or an open circuit: the table must wait, so the batch claimed ahead may not be sent."""
        return self.batches.pause.active or self.batches.guard.circuit_open

    def _release_unsent(self, outbox_table: OutboxTable, upcoming: list[ClaimedMessage], report: RelayReport) -> None:
        """The prefetched batch goes back unsent, its attempt given back."""
        why = self.batches.pause.reason if self.batches.pause.active else "the circuit is open"
        outbox_table.release_unsent(self.batches.worker, held(upcoming), f"released unsent: {why}")
        self.batches.forget(upcoming)
        report.claimed -= len(upcoming)
