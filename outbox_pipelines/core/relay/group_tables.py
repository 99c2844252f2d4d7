"""A relay group's tables: what the group knows of each (``TableWorker``), what its run did (``GroupReport``), and
each table's problem, recorded and cleared (``tell_problem``, ``clear_problem``)."""

import logging
import threading
from dataclasses import dataclass, field

import psycopg

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.errors import OutboxError
from outbox_pipelines.core.models import cap_error
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.relay.loop import Relay
from outbox_pipelines.core.relay.report import RelayReport, RunOutcome
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import SharedTables

log = logging.getLogger("outbox_pipelines.relay")


@dataclass
class TableWorker:
    """One table of the group: its relay (built at the first activation), what it did, what is wrong."""

    settings: TableSettings
    wake: threading.Event = field(default_factory=threading.Event)
    report: RelayReport | None = None  # every finished activation, merged
    live: RelayReport | None = None  # the activation running now, as its last progress call saw it
    relay: Relay | None = None
    destination: Destination | None = None
    problem: str | None = None  # what keeps it from relaying, as recorded
    left_out: bool = False  # cannot be relayed by this run at all (its settings say so, or it does not exist)
    active: bool = False
    activations: int = 0
    failures: int = 0  # activations in a row that raised
    not_before: float = 0.0  # time.monotonic() before which it is not woken again

    @property
    def name(self) -> str:
        return self.settings.name

    def totals(self) -> RelayReport | None:
        """What it did in this run so far: the finished activations and the one running now."""
        parts = [part for part in (self.report, self.live if self.active else None) if part is not None]
        if len(parts) < 2:
            return parts[0] if parts else None
        combined = RelayReport(self.name, parts[0].worker)
        for part in parts:
            combined.merge(part)
        return combined


@dataclass
class GroupReport:
    """What a group run did: a report per table that relayed, and the tables it could not relay."""

    group: str
    tables: dict[str, RelayReport] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    stopped_because: str = ""

    @property
    def sent(self) -> int:
        return sum(r.sent for r in self.tables.values())

    @property
    def outcome(self) -> RunOutcome:
        """The run's outcome in one word (its Dagster tag): the worst that happened to any table."""
        outcomes = {report.outcome for report in self.tables.values()}
        for outcome in (RunOutcome.DESTINATION_FAILING, RunOutcome.DEAD_LETTERS):
            if outcome in outcomes:
                return outcome
        if self.problems:
            return RunOutcome.TABLE_PROBLEMS
        return RunOutcome.DELIVERED if RunOutcome.DELIVERED in outcomes else RunOutcome.IDLE


def tell_problem(url: str, group: str, worker: TableWorker, text: str, shared: SharedTables | None = None) -> None:
    """Told once (the log, the table's row of outbox_destination_health): a changed problem is told again."""
    text = cap_error(redact_text(text)) or text
    if worker.problem == text:
        return
    worker.problem = text
    log.error("relay group %s: %s", group, text)
    try:
        if shared is not None:
            shared.record_relay_problem(worker.name, text)
        else:
            with connect(url) as conn:
                SharedTables(conn).record_relay_problem(worker.name, text)
    except (psycopg.Error, OutboxError) as exc:
        log.warning("relay group %s: could not record the problem of %s: %s", group, worker.name, exc)


def clear_problem(url: str, group: str, worker: TableWorker) -> None:
    worker.problem = None
    try:
        with connect(url) as conn:
            SharedTables(conn).clear_relay_problem(worker.name)
    except (psycopg.Error, OutboxError) as exc:
        log.warning("relay group %s: could not clear the problem of %s: %s", group, worker.name, exc)
    log.warning("relay %s: relaying again", worker.name)
