"""The on-call sweep: what a sensor runs every few seconds to keep people informed.

One pass: find relays that died and return their rows; evaluate every table's
checks at a bounded cost; announce what changed (fired, reminded, resolved).
It never falls behind, because it looks at the tables as they are now rather
than at the history of runs.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.errors import InvalidTableName, UnknownTable
from outbox_pipelines.core.oncall.alerts import (
    NO_LINKS,
    AlertSeverity,
    Condition,
    Links,
    alert_severity,
    announce,
    announce_event,
)
from outbox_pipelines.core.oncall.database_health import vacuum_condition, vacuum_verdicts
from outbox_pipelines.core.oncall.health import CheckVerdict, TableStatus, evaluate_checks
from outbox_pipelines.core.oncall.table_status import read_table_status, undeclared_tables
from outbox_pipelines.core.relay import liveness
from outbox_pipelines.core.settings import CheckThresholds, Settings, TableSettings
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import SharedTables
from outbox_pipelines.core.storage.table_owners import owners

log = logging.getLogger("outbox_pipelines.oncall")


@dataclass
class SweepReport:
    now: datetime | None = None
    verdicts: dict[str, list[CheckVerdict]] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    dead_relays: list[liveness.DeadRelay] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# The checks whose failure follows from the destination's while it fails: its alert alone tells the outage.
HELD_BY_DESTINATION = frozenset({"lag", "backlog"})


def check_condition(table_name: str, verdict: CheckVerdict, links: Links = NO_LINKS) -> Condition:
    return Condition(
        key=f"check:{table_name}:{verdict.name}",
        severity=alert_severity(verdict.severity),
        summary=verdict.description,
        kind="check",
        link=links.table(table_name, check=verdict.name),
        link_label=links.label,
        table=table_name,
        check=verdict.name,
        figures={k: v for k, v in verdict.metadata.items() if v is not None},
        held_by=f"check:{table_name}:destination" if verdict.name in HELD_BY_DESTINATION else None,
    )


def settings_condition(settings: Settings, links: Links = NO_LINKS) -> Condition:
    """The declaration as a whole: an error while it cannot be read at all (no table is known, so none is
    relayed or checked), ok once it can (which resolves the alert)."""
    return Condition(
        key="settings",
        severity=AlertSeverity.ERROR if settings.problem else AlertSeverity.OK,
        summary=(
            f"the outbox's table settings cannot be read, so no table is relayed or checked: {settings.problem}. "
            "Fix the file, then reload the code location."
            if settings.problem
            else "the outbox's table settings are read again"
        ),
        kind="settings",
        link=links.settings(),
        link_label=links.label,
    )


def undeclared_condition(status: TableStatus) -> Condition:
    """An outbox table in the database that no project declares (none owns it, or this one does and no longer
    declares it): a warning while messages wait there, which nothing will ever relay; ok once none does (or it
    is declared, and its own checks take over)."""
    waiting = status.waiting
    return Condition(
        key=f"undeclared:{status.table}",
        severity=AlertSeverity.WARNING if waiting else AlertSeverity.OK,
        summary=(
            f"outbox table {status.table} is in the database but declared by no project: {waiting} message"
            f"{'s' if waiting != 1 else ''} wait there that no relay will deliver. Declare it (a [tables."
            f"{status.table}] section in outbox.toml, or the OutboxComponent's defs.yaml) if it is this project's; "
            "if the application should not write there, fix the table name it enqueues into."
            if waiting
            else f"outbox table {status.table}: nothing waits there any more (or it is declared now)"
        ),
        kind="undeclared_table",
        link="",
        table=status.table,
        figures={"waiting": waiting},
    )


def relay_died_condition(relays: list[liveness.DeadRelay], links: Links = NO_LINKS) -> Condition:
    """One alert for the relays of one process that died (a relay group's run hosts many tables' relays; a
    CLI relay, one): which tables, how many rows went back, what to look at."""
    first = max(relays, key=lambda relay: relay.held)
    run_id = first.run_id
    who = f"relay run {run_id[:8]}" if run_id else f"relay {first.worker}"
    why = (
        f"no heartbeat for {duration_words(first.silent_s)} and its process is gone"
        if first.silent_s
        else "its process is gone"
    )
    held, returned = sum(r.held for r in relays), sum(r.returned for r in relays)
    tables = sorted({relay.table for relay in relays})
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    where = tables[0] if len(tables) == 1 else f"{len(tables)} tables ({shown})"
    # A run's relays start and stop with their tables' backlogs: the tables named are those whose relays were
    # running when it died, and the time is theirs (a run may have been up longer).
    relays_there = "its relay there" if len(relays) == 1 else "its relays there"
    summary = (
        f"{where}: {who} died ({why}); {relays_there} had been running "
        f"{duration_words(max(r.ran_s for r in relays))}; it held {held} message{'s' if held != 1 else ''}, "
        f"{returned} returned to pending for the next relay. If it happens again, read the run's logs and check "
        "the host's memory (OOM killer)."
    )
    return Condition(
        key=f"relay:run:{run_id}" if run_id else f"relay:{first.worker}",
        severity=AlertSeverity.ERROR,
        summary=summary,
        kind="relay_died",
        link=links.run(run_id) if run_id else links.table(first.table),
        link_label=links.label,
        table=first.table,
        job=first.job if run_id else None,
        run_id=run_id,
        figures={
            "held": held,
            "returned": returned,
            "ran_s": round(max(r.ran_s for r in relays), 1),
            "silent_s": round(first.silent_s, 1),
            "tables": tables,
            "worker": first.worker,
            "workers": [r.worker for r in relays],
            "pid": first.pid,
            "host": first.host,
        },
    )


def _by_process(relays: list[liveness.DeadRelay]) -> list[list[liveness.DeadRelay]]:
    """The dead relays grouped by the run (or, without one, the worker) they belonged to."""
    groups: dict[str, list[liveness.DeadRelay]] = {}
    for relay in relays:
        groups.setdefault(relay.run_id or relay.worker, []).append(relay)
    return list(groups.values())


def sweep(
    url: str,
    settings: Settings,
    *,
    now: datetime | None = None,
    webhook_url: str | None = None,
    repeat_s: float | None = None,
    links: Links = NO_LINKS,
) -> SweepReport:
    """Bury dead relays, evaluate every table's checks, announce what changed."""
    report = SweepReport()
    with connect(url) as conn:
        report.now = now or SharedTables(conn).database_now()
        max_attempts = {name: table.retry.max_attempts for name, table in settings.tables.items()}
        buried = [
            dead
            for relay in liveness.find_dead(conn, now=now)
            if (dead := liveness.bury(conn, relay, max_attempts.get(relay.table, 1_000_000))) is not None
        ]
        report.dead_relays += buried  # one not buried here was told by whoever buried it
        report.alerts += [
            announce_event(relay_died_condition(relays, links), now=report.now, webhook_url=webhook_url)
            for relays in _by_process(buried)
        ]
        conditions = [settings_condition(settings, links)]
        for name in sorted({*settings.tables, *settings.broken}):
            try:
                verdicts = table_verdicts(conn, settings, name, now=now)
            except UnknownTable as exc:
                report.problems.append(str(exc))
                continue
            report.verdicts[name] = verdicts
            conditions += [check_condition(name, v, links) for v in verdicts]
        # The database side (core/oncall/database_health.py): a vacuum verdict per table, one alert for all.
        vacuum = vacuum_verdicts(conn, settings, list(report.verdicts), now=now)
        for name, verdict in vacuum.items():
            report.verdicts[name].append(verdict)
        conditions.append(vacuum_condition(vacuum, links))
        declared = [*settings.tables, *settings.broken]
        conditions += [undeclared_condition(status) for status in undeclared_tables(conn, declared, settings.project)]
        report.alerts += announce(conn, conditions, now=report.now, repeat_s=repeat_s, webhook_url=webhook_url)
    return report


def table_verdicts(conn: Any, settings: Settings, name: str, *, now: datetime | None = None) -> list[CheckVerdict]:
    """A table's checks, graded by its settings; a table whose section cannot be used gets them too, with
    default thresholds (its relay check says why), and so does a declared table not in the database yet."""
    return table_status_and_verdicts(conn, settings, name, now=now)[1]


def table_status_and_verdicts(
    conn: Any, settings: Settings, name: str, *, now: datetime | None = None
) -> tuple[TableStatus | None, list[CheckVerdict]]:
    """``table_verdicts`` with the one read of the table they grade (its paused topics included), for a page that
    shows both; the status is None for a table whose section cannot be used and that does not exist."""
    table, problem = settings.tables.get(name), settings.broken.get(name)
    if problem is None and table is not None:  # another project's table: no relay of this one takes it
        owner = owners(conn, [name]).get(name)
        if owner is not None and owner.project != settings.project:
            problem = owner.refusal(settings.project)
    status: TableStatus | None
    try:
        status = read_table_status(conn, table or TableSettings(name), now=now)
    except (UnknownTable, InvalidTableName) as exc:
        # Declared but not in the database (db upgrade not run for it): the relay check fails saying so, the
        # checks run still completes, on a connection whose failed read is rolled back.
        if not getattr(conn, "autocommit", True):
            conn.rollback()
        problem = problem or str(exc)
        status = None
    verdicts = evaluate_checks(
        status or TableStatus(name),
        table.checks if table else CheckThresholds(),
        delivers_nowhere=table.delivers_nowhere if table else None,
        settings_problem=problem,
    )
    return status, verdicts


def relays_died_with_run(
    url: str, settings: Settings, run_id: str, *, webhook_url: str | None = None, links: Links = NO_LINKS
) -> list[dict[str, Any]]:
    """A failed run whose relay never said goodbye (SIGKILL, OOM): return its rows now and tell on-call
    that the relay died (one alert, instead of a bare run failure). Empty if the run held no relay."""
    max_attempts = {name: table.retry.max_attempts for name, table in settings.tables.items()}
    with connect(url) as conn:
        now = SharedTables(conn).database_now()
        buried = liveness.bury_relays_of_failed_run(conn, run_id, max_attempts)
        return [announce_event(relay_died_condition(buried, links), now=now, webhook_url=webhook_url)] if buried else []
