"""One ``Relay.run``: what the loop's steps share (its budget, report, connection and clocks), and ``Release``."""

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from outbox_pipelines.core.relay import ordering
from outbox_pipelines.core.relay.budget import Budget
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.relay.report import RelayReport
from outbox_pipelines.core.relay.session import RelaySession
from outbox_pipelines.core.storage.table import OutboxTable

# (seconds since the last claim that took rows, seconds since the invocation started) -> a reason to end it
# now, or None. A relay group (relay/group.py) ends a table's idle invocation with it, or yields its place.
Release = Callable[[float, float], str | None]


@dataclass
class Invocation:
    """One ``run``: its budget, its report, its connection (replaced on reconnect) and its clocks."""

    budget: Budget
    report: RelayReport
    session: RelaySession
    outbox_table: OutboxTable
    keeper: LeaseKeeper
    single_active: bool
    started: float
    next_progress: float
    next_requeue: float
    requeue_every: float
    # When the last claim took rows (time.monotonic()), and what may end the invocation early (``Release``).
    last_work: float = 0.0
    release: "Release | None" = None
    # Where the ordering sweep goes on from (core/relay/ordering.py), at the requeue's pace.
    ordering_sweep: ordering.SweepCursor = field(default_factory=ordering.SweepCursor)

    def requeue_due(self, now: float) -> bool:
        """Whether the periodic requeue of stuck rows (and the ordering sweep) is due at ``now`` (time.monotonic())."""
        return now >= self.next_requeue

    @property
    def conn(self) -> psycopg.Connection:
        return self.session.conn

    def use(self, session: RelaySession) -> None:
        self.session, self.outbox_table = session, OutboxTable(session.conn, self.report.table)
