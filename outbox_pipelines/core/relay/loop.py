"""The relay: claim → dispatch → settle, over one outbox table, under a budget.

One relay owns one connection for claims and settles (the single-active lock, LISTEN) and a lease keeper thread;
a stop request settles the batch in flight, so no lease is left behind. Beside it: relay/invocation.py (one run's
state), relay/recovery.py (after a database error), relay/stop.py. How: docs/explanation/relay.md.
"""

import contextlib
import logging
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, MessageState
from outbox_pipelines.core.relay import liveness, ordering, single_active
from outbox_pipelines.core.relay.batch import BatchRunner
from outbox_pipelines.core.relay.budget import Budget
from outbox_pipelines.core.relay.destination_health import DestinationGuard
from outbox_pipelines.core.relay.hold import relay_held_first
from outbox_pipelines.core.relay.invocation import Invocation, Release
from outbox_pipelines.core.relay.lanes import HeldLanes, SettleFailed
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.relay.pause import Pause
from outbox_pipelines.core.relay.pipeline import Pipeline
from outbox_pipelines.core.relay.recovery import Recovery
from outbox_pipelines.core.relay.report import RelayReport
from outbox_pipelines.core.relay.session import open_relay_session, take_wakeups, wait_for_wakeup
from outbox_pipelines.core.relay.stop import StopReason, StopRequest
from outbox_pipelines.core.retry import UniformSource
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.core.telemetry import tracing
from outbox_pipelines.core.telemetry.counts import count_claim

log = logging.getLogger("outbox_pipelines.relay")

DECLARED_DEAD = "declared dead by the liveness sweep (its heartbeat was lost); stopped"


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Relay:
    def __init__(
        self,
        url: str,
        table: TableSettings,
        destination: Destination,
        *,
        worker_id: str | None = None,
        uniform: UniformSource = random.uniform,
        progress: Callable[[RelayReport], None] | None = None,
        progress_every_s: float = 5.0,
        run_id: str | None = None,
        job: str | None = None,
        direct_url: str | None = None,
    ) -> None:
        if not isinstance(destination, Destination):
            # The relay uses the base class's defaults (pipelined, paused_topics, after_settle): a
            # duck-typed object would fail at its first claim instead of here.
            raise TypeError(
                f"{type(destination).__name__} is not a Destination: subclass "
                "outbox_pipelines.Destination and override deliver (and what else it needs)"
            )
        self.url = url
        # the relay's session, when a transaction pooler sits at url (core/storage/pooler.py)
        self.direct_url = direct_url
        self.table = table
        self.destination = destination
        self.worker = worker_id or default_worker_id()
        self.run_id = run_id
        self.job = job  # the orchestrator's job this relay runs in (named by an alert if the relay dies)
        self.guard = DestinationGuard(
            table.name, destination.name, threshold=table.circuit_threshold, probe_interval_s=table.probe_interval_s
        )
        self.uniform = uniform
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.pause = Pause()
        self.batches = BatchRunner(table, destination, self.worker, self.guard, self.pause, uniform)
        self.pipeline = Pipeline(self.batches)
        self.lanes = HeldLanes(direct_url or url, table.name)
        self.left_waiting = 0  # rows the last claim left waiting behind their keys' heads: not an emptied queue
        self._stop = StopRequest()
        self.recovery = Recovery(url, direct_url, table, self.worker, self._stop)

    # -- control -------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        """Finish the batch in flight, settle it, and return. Safe from a signal handler and from any thread:
        it only records the request, which the loop's waits notice within a slice (relay/stop.py)."""
        self._stop.request()

    @property
    def stop_request(self) -> StopRequest:
        """What ``request_stop`` sets (a process's StopDeadline watches it: relay/stop.py)."""
        return self._stop

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    # -- the loop ------------------------------------------------------------
    def run(
        self,
        *,
        max_seconds: float | None = None,
        max_entries: int | None = None,
        once: bool = False,
        release: Release | None = None,
    ) -> RelayReport:
        """Relay under the budget; ``release`` may end the invocation between batches (see ``Release``)."""
        budget = Budget.starting_now(self._stop, max_seconds=max_seconds, max_entries=max_entries, once=once)
        run = self._start(budget)
        run.release = release
        try:
            if self._hold_the_lock(run):
                while self._turn(run):
                    pass
        except BaseException:
            # Whatever ends the loop this way (Ctrl-C without the signal handlers, a bug), the batch it held
            # is not settled: its rows go back to pending now instead of waiting out their lease.
            run.keeper.release()
            self.lanes.abandon(run)
            self.recovery.give_back_held(run)
            raise
        finally:
            self._end(run)
        return run.report

    def _start(self, budget: Budget) -> Invocation:
        started = time.monotonic()
        session = open_relay_session(self.url, self.table, self.direct_url)
        conn = session.conn
        liveness.register(conn, self.worker, self.table.name, self.run_id, job=self.job)
        keeper = LeaseKeeper(self.url, self.table.name, self.worker, self.table.lease_s, self.table.renew_every_s)
        return Invocation(
            budget,
            RelayReport(self.table.name, self.worker),
            session,
            OutboxTable(conn, self.table.name),
            keeper,
            single_active=self.table.mode == "single-active",
            started=started,
            next_progress=started + self.progress_every_s,
            next_requeue=started,
            requeue_every=max(min(self.table.lease_s / 2.0, 30.0), self.table.poll_interval_s),
            last_work=started,
        )

    def _hold_the_lock(self, run: Invocation) -> bool:
        """Single-active: take the table's lock, standing by while another relay holds it. False: gave up."""
        if not run.single_active:
            return True
        report = run.report
        report.lock_held = single_active.try_lock(run.outbox_table)
        while not report.lock_held:
            # A relay group's standby gives its place up once its turn is over while other tables wait
            # (asked as if it had just worked: standing by is not idleness).
            given_up = run.release is not None and run.release(0.0, time.monotonic() - run.started)
            if run.budget.once or run.budget.stop_requested or run.budget.out_of_time() or given_up:
                report.stopped_because = StopReason.LOCK_HELD_ELSEWHERE
                return False
            # Standby: take over as soon as the holder stops (checked for stop requests every second).
            wait_s = min(self.table.poll_interval_s, 1.0, run.budget.time_left())
            report.lock_held = single_active.wait_for_lock(run.outbox_table, wait_s)
        # Standing by was not idleness: a relay group's release counts idle time from the takeover, so a standby
        # that takes over at a hand-off claims at once instead of being let go as idle.
        run.last_work = time.monotonic()
        return True

    def _turn(self, run: Invocation) -> bool:
        """One pass of the loop; False when the invocation ends (``stopped_because`` says why)."""
        reason = self._reason_to_end(run)
        if self.lanes.settling and (reason or self.pause.active or run.requeue_due(time.monotonic())):
            try:  # anything but the next claim waits for the batch committing behind (relay/lanes.py)
                self.lanes.go_home(run)
            except SettleFailed as failed:
                return self._recover(run, failed.batch, failed.error)
        if reason:
            run.report.stopped_because = reason
            return False
        self._report_progress_if_due(run)
        if self.pause.active:
            return self._wait_out_the_pause(run)
        batch: list[ClaimedMessage] = []
        try:
            self._requeue_expired_if_due(run)
            if self._holds_first(run):  # relay/hold.py; it fills batch as soon as it is claimed
                relay_held_first(
                    run, self.table, self.batches, self.worker, lambda: self._claim_next(run), batch, self.lanes
                )
            else:
                batch = self._claim_next(run)
                if batch:
                    self._relay(run, batch)
            if run.outbox_table.contended_keys:  # after the batch's transaction: see ordering.py
                ordering.release_contended(run.outbox_table, patient=False)
            if (not batch and not self.left_waiting) or self._emptied_the_queue(run, batch):
                return self._idle(run)
            if not self.lanes.busy(run.session.conn):
                take_wakeups(run.session)  # the next claim sees what they announced
            return True
        except SettleFailed as failed:
            return self._recover(run, failed.batch, failed.error)
        except psycopg.OperationalError as exc:
            return self._recover(run, batch, exc)

    def _reason_to_end(self, run: Invocation) -> str | None:
        if run.budget.stop_requested:
            return StopReason.STOP_REQUESTED
        if run.keeper.declared_dead:
            return DECLARED_DEAD
        if run.release is not None:
            now = time.monotonic()
            reason = run.release(now - run.last_work, now - run.started)
            if reason:
                return reason
        return run.budget.used_up(run.report.claimed)

    def _report_progress_if_due(self, run: Invocation) -> None:
        now = time.monotonic()
        if self.progress and now >= run.next_progress:
            run.report.seconds = now - run.started
            self.progress(run.report)
            run.next_progress = now + self.progress_every_s

    def _wait_out_the_pause(self, run: Invocation) -> bool:
        if run.budget.once:
            run.report.stopped_because = f"{self.pause.reason}; the rest waits as pending"
            return False
        wait_for_wakeup(run.session, min(self.pause.remaining(), run.budget.time_left()), self._stop)
        return True

    def _emptied_the_queue(self, run: Invocation, batch: list[ClaimedMessage]) -> bool:
        """Fewer rows than asked for, with none left waiting behind their keys' heads (the next claim reads past those):
        nothing else was ready, so it waits for a NOTIFY (not pipelined, once, polling, nor cut by the entry budget)."""
        return (
            run.session.listening
            and not run.budget.once
            and not self.destination.pipelined
            and 0 < len(batch) < self.table.batch_size - self.left_waiting
            and run.budget.used_up(run.report.claimed) is None
        )

    def _idle(self, run: Invocation) -> bool:
        """Nothing to claim: a one-shot run ends; otherwise sleep until the next row is due or a NOTIFY."""
        self.lanes.go_home(run)
        if run.budget.once:
            run.report.stopped_because = (
                f"{self.pause.reason}; the rest waits as pending" if self.pause.active else StopReason.NOTHING_READY
            )
            return False
        if take_wakeups(run.session):
            return True  # a NOTIFY came while the relay was busy: claim now, no next-due read, no wait
        due = run.outbox_table.next_due_in_s(paused_topics=self._paused_topics())
        idle = self.table.idle_sleep_s if due is None else min(max(due, 0.0), self.table.idle_sleep_s)
        if run.outbox_table.contended_keys:
            # A writer was committing a message of these keys: its commit takes milliseconds, and the key's
            # next message waits for the release (a NOTIFY still wakes the relay at once).
            idle = min(idle, ordering.CONTENDED_RETRY_S)
        if run.release is not None:
            idle = min(idle, 1.0)  # a release is asked at least once a second (a NOTIFY still wakes it at once)
        wait_for_wakeup(run.session, min(idle, run.budget.time_left()), self._stop)
        return True

    def _relay(self, run: Invocation, batch: list[ClaimedMessage]) -> None:
        if self.destination.pipelined:
            self.pipeline.run(run.outbox_table, run.keeper, batch, run.report, lambda: self._claim_next(run))
        else:
            self.batches.run(run.outbox_table, run.keeper, batch, run.report)

    def _holds_first(self, run: Invocation) -> bool:
        """Each batch is held in a transaction (relay/hold.py): under claim = "transaction", and under "auto" but for
        a pipelined destination or a session through a transaction pooler (docs/explanation/relay.md, "Claim modes")."""
        if self.table.claim == "transaction":
            return True
        return self.table.claim == "auto" and not self.destination.pipelined and run.session.listening

    def _end(self, run: Invocation) -> None:
        self.lanes.abandon(run)
        if run.outbox_table.contended_keys and not run.session.conn.closed:
            with contextlib.suppress(psycopg.Error):  # what stays held is the sweep's (ordering.py)
                ordering.release_contended(run.outbox_table)
        run.keeper.close()
        self.pipeline.shutdown()
        self.lanes.shutdown()
        report = run.report
        report.seconds = time.monotonic() - run.started
        report.circuit = "open" if self.guard.circuit_open else report.circuit
        self.recovery.say_goodbye(run.conn, run.single_active and report.lock_held, report.stopped_because or "ended")

    # -- claiming --------------------------------------------------------------
    def _claim_next(self, run: Invocation) -> list[ClaimedMessage]:
        """The next batch, within the budgets and what the table's destination allows now."""
        report, self.left_waiting = run.report, 0
        limit = run.budget.claim_limit(self.table.batch_size, report.claimed)
        if limit <= 0 or self.pause.active:
            return []
        # Only the claim goes beside a batch committing behind (relay/lanes.py): a write to the destination's row waits.
        paused = (self.table.paused_topics, self.destination.paused_topics)
        self.guard.note_paused(run.outbox_table.conn, *paused, before_write=self.lanes.settled)
        # The table's pause and circuit are read at every claim, by the claim itself while the
        # destination is plainly open (one round trip, not two, before a message reaches its
        # handler). Only a claim that found nothing reads the gate: it may have been closed.
        claimed = self._claim(run, limit, gated=True)
        if not claimed and self.lanes.settling:  # beside a batch whose commit releases its keys' next messages
            self.lanes.settled()  # and before the gate is read: none of it goes beside that commit
            claimed = self._claim(run, limit, gated=True)
        if claimed:
            self.guard.saw_open()
            report.circuit = "closed"
        else:
            gate = self.guard.gate(run.outbox_table.conn)
            report.circuit = "open" if gate.circuit_open else "closed"
            if gate.limit == 0:
                self.pause.hold(gate.wait_s, gate.reason)
            elif gate.limit is not None:  # a probe: one message past the closed gate
                report.probes += 1
                claimed = self._claim(run, min(limit, gate.limit), gated=False)
        report.claimed += len(claimed)
        self.left_waiting = run.outbox_table.left_waiting
        if claimed:
            run.last_work = time.monotonic()
        count_claim(self.table.name, len(claimed))
        self.batches.note_claimed(claimed)
        return claimed

    def _claim(self, run: Invocation, limit: int, *, gated: bool) -> list[ClaimedMessage]:
        attributes = {"outbox.table": self.table.name}
        started = time.perf_counter()
        with tracing.span("outbox.claim", attributes) as span:
            if self._holds_first(run):
                claimed = run.outbox_table.claim_held(
                    limit,
                    self.table.lease_s,
                    paused_topics=self._paused_topics(),
                    gated=gated,
                    reuse_plan=True,
                    max_bytes=self.table.batch_bytes,
                )
            else:
                claimed = run.outbox_table.claim(
                    self.worker,
                    limit,
                    self.table.lease_s,
                    paused_topics=self._paused_topics(),
                    max_attempts=self.table.retry.max_attempts,
                    audit_claims=self.table.audit == "all",
                    fast_commit=True,
                    gated=gated,
                    reuse_plan=True,
                    max_bytes=self.table.batch_bytes,
                )
            span.set_attribute("outbox.claimed", len(claimed))
        self.batches.metrics.claim.observe(time.perf_counter() - started)
        return claimed

    def _paused_topics(self) -> tuple[str, ...]:
        """Read at every claim, so switching a topic off takes effect on a running relay."""
        return tuple(self.table.paused_topics) + tuple(self.destination.paused_topics)

    def _requeue_expired_if_due(self, run: Invocation) -> None:
        now = time.monotonic()
        if not run.requeue_due(now):
            return
        rows = run.outbox_table.requeue_stuck(
            self.worker,
            stuck_after_s=self.table.stuck_threshold_s,
            max_attempts=self.table.retry.max_attempts,
            pass_over_dead=self.table.ordering == "skip",
        )
        run.report.requeued += sum(1 for r in rows if r["status"] == MessageState.PENDING)
        ordering.sweep(run.outbox_table, self.table, run.ordering_sweep, worker=self.worker)
        run.next_requeue = now + run.requeue_every

    # -- database errors -------------------------------------------------------
    def _recover(self, run: Invocation, batch: list[ClaimedMessage], exc: psycopg.OperationalError) -> bool:
        """Lost connection or statement timeout: the batch is abandoned at once (its leases are no longer
        renewed), and given back as soon as the database answers again. False: the invocation ends."""
        run.keeper.release()
        batch = batch + self.lanes.abandon(run)  # and the batch committing behind, if its settle failed too
        self.batches.forget_claims()
        run.report.db_errors += 1
        log.warning("relay %s: database error, reconnecting: %s", self.table.name, exc)
        fresh = self.recovery.reconnect(run)
        if fresh is None:
            return False
        run.use(fresh)
        self.recovery.audit_db_problem(run.outbox_table, batch, exc)
        self.recovery.give_back_held(run)
        return True
