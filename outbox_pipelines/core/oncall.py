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

from outbox_pipelines.core import liveness
from outbox_pipelines.core.alerts import Condition, Severity, announce, announce_event, asset_link, run_link
from outbox_pipelines.core.db import connect
from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.health import CheckVerdict, evaluate_checks, read_status
from outbox_pipelines.core.settings import Settings
from outbox_pipelines.core.table import OutboxTable, SharedTables

log = logging.getLogger("outbox_pipelines.oncall")

# A check's grade as an alert's severity.
SEVERITY: dict[str, Severity] = {"ok": "ok", "warn": "warning", "error": "error"}


@dataclass
class SweepReport:
    now: datetime | None = None
    verdicts: dict[str, list[CheckVerdict]] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    dead_relays: list[liveness.DeadRelay] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_condition(table_name: str, verdict: CheckVerdict) -> Condition:
    return Condition(
        key=f"check:{table_name}:{verdict.name}", severity=SEVERITY[verdict.severity],
        summary=verdict.description, kind="check", link=asset_link(table_name), table=table_name, check=verdict.name,
        figures={k: v for k, v in verdict.metadata.items() if v is not None},
    )


def relay_died_condition(relay: liveness.DeadRelay) -> Condition:
    who = f"relay run {relay.run_id[:8]}" if relay.run_id else f"relay {relay.worker}"
    why = (f"no heartbeat for {relay.silent_s:.0f} s and its process is gone" if relay.silent_s
           else "its process is gone")
    summary = (f"{relay.table}: {who} died ({why}) after "
               f"running {relay.ran_s / 60:.1f} min; it held {relay.held} message{'s' if relay.held != 1 else ''}, "
               f"{relay.returned} returned to pending for the next relay. If it happens again, read the run's logs "
               "and check the host's memory (OOM killer).")
    return Condition(
        key=f"relay:{relay.worker}", severity="error", summary=summary, kind="relay_died",
        link=run_link(relay.run_id) if relay.run_id else asset_link(relay.table), table=relay.table,
        job=f"relay_{relay.table}_job" if relay.run_id else None, run_id=relay.run_id,
        figures={"held": relay.held, "returned": relay.returned, "ran_s": round(relay.ran_s, 1),
                 "silent_s": round(relay.silent_s, 1), "worker": relay.worker, "pid": relay.pid, "host": relay.host},
    )


def sweep(url: str, settings: Settings, *, now: datetime | None = None, webhook_url: str | None = None,
          repeat_s: float | None = None) -> SweepReport:
    """Bury dead relays, evaluate every table's checks, announce what changed."""
    report = SweepReport()
    with connect(url) as conn:
        report.now = now or SharedTables(conn).database_now()
        max_attempts = {name: table.retry.max_attempts for name, table in settings.tables.items()}
        for relay in liveness.find_dead(conn, now=now):
            buried = liveness.bury(conn, relay, max_attempts.get(relay.table, 1_000_000))
            if buried is None:
                continue  # told by whoever buried it
            report.dead_relays.append(buried)
            report.alerts.append(announce_event(relay_died_condition(buried), now=report.now, webhook_url=webhook_url))
        conditions = []
        for name in sorted(settings.tables):
            table = settings.tables[name]
            try:
                status = read_status(OutboxTable(conn, name), stuck_after_s=table.stuck_threshold_s, now=now)
            except UnknownTable as exc:
                report.problems.append(str(exc))
                continue
            verdicts = evaluate_checks(status, table.checks, delivers_nowhere=table.delivers_nowhere)
            report.verdicts[name] = verdicts
            conditions += [check_condition(name, v) for v in verdicts]
        report.alerts += announce(conn, conditions, now=report.now, repeat_s=repeat_s, webhook_url=webhook_url)
    return report


def relays_died_with_run(url: str, settings: Settings, run_id: str, *,
                         webhook_url: str | None = None) -> list[dict[str, Any]]:
    """A failed run whose relay never said goodbye (SIGKILL, OOM): return its rows now and tell on-call
    that the relay died (one alert, instead of a bare run failure). Empty if the run held no relay."""
    max_attempts = {name: table.retry.max_attempts for name, table in settings.tables.items()}
    with connect(url) as conn:
        now = SharedTables(conn).database_now()
        return [announce_event(relay_died_condition(relay), now=now, webhook_url=webhook_url)
                for relay in liveness.bury_relays_of_failed_run(conn, run_id, max_attempts)]
