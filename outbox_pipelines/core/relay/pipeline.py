"""Pipelined delivery: deliver batch N on a thread of its own while claiming N+1.

A batch delivered whole lets the next go on the wire at once and is settled while it is in flight, on the lease
keeper's connection while the next claim runs on the relay's; any other batch is settled first, so an outage or a
429 is known before more is sent. Why: docs/explanation/relay.md, "Claim, dispatch, settle".
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import psycopg

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
        # The settle of a batch delivered whole, on its own thread and the keeper's connection: one at a time.
        self._settler: ThreadPoolExecutor | None = None
        self._settling: Future[set[str]] | None = None

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
            self._settler = ThreadPoolExecutor(1, thread_name_prefix=f"outbox-settle-{self.batches.table.name}")
        plan = self.batches.plan(outbox_table, first)
        self._in_flight = self._thread.submit(self.batches.deliver, first, plan)
        keeper.hold(held(first))
        try:
            self._loop(outbox_table, keeper, first, plan, report, claim_next)
        except BaseException:
            # Nothing may be given back while it is still on the wire: wait for the delivery in flight.
            wait([self._in_flight])
            if self._settling is not None:
                wait([self._settling])
            self._settling = None
            raise
        finally:
            self._settled(outbox_table)

    def shutdown(self) -> None:
        for pool in (self._thread, self._settler):
            if pool is not None:
                pool.shutdown(wait=True)
        self._thread = self._settler = None

    def _settle_behind(
        self,
        outbox_table: OutboxTable,
        keeper: LeaseKeeper,
        batch: list[ClaimedMessage],
        outcomes: list[Outcome],
        report: RelayReport,
    ) -> None:
        """Settle a batch delivered whole on the settle thread, over the keeper's connection, while this thread
        claims the next on the relay's: a settle and a claim of one relay at once, as two competing relays' are
        (each row is the settle's or the claim's, per-key order is the claim's to keep). The settle before it
        has finished first, so batches settle in order, one at a time."""
        self._settled(outbox_table)
        assert self._settler is not None
        name = outbox_table.table_name

        def settle(conn: psycopg.Connection) -> set[str]:
            table = OutboxTable(conn, name)
            self.batches.finish(table, batch, outcomes, report, held=False)
            return table.contended_keys

        self._settling = self._settler.submit(keeper.on_connection, settle)

    def _settled(self, outbox_table: OutboxTable) -> None:
        """Wait for the settle in flight (raising what it raised); the keys it left contended are the relay's."""
        settling, self._settling = self._settling, None
        if settling is not None:
            outbox_table.contended_keys.update(settling.result())

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
                keeper.hold(held(upcoming))
                self._settle_behind(outbox_table, keeper, current, outcomes, report)
                current, plan = upcoming, next_plan
                continue
            # Anything else is settled before the next batch goes on the wire: a failure that opens the
            # circuit or a 429 holds back the batch claimed ahead.
            self._settled(outbox_table)
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
