"""On-call in Dagster: the sensor that keeps the checks current and tells people what changed.

``outbox_oncall`` runs the core's on-call sweep every 15 s, records each table's state and checks on its asset
(defs/table_health.py, a few tables a tick: defs/oncall_cursor.py) and marks the runs of dead relays failed
(defs/alerts.py tells about the other failed runs).
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.oncall.checks import CheckVerdict
from outbox_pipelines.core.oncall.sweep import SweepReport
from outbox_pipelines.core.storage.db import driver_connection
from outbox_pipelines.defs.alerts import FAILURE_TAG
from outbox_pipelines.defs.checks import SEVERITY, check_metadata
from outbox_pipelines.defs.common import table_asset_key
from outbox_pipelines.defs.oncall_cursor import Recorded, tables_to_record
from outbox_pipelines.defs.resources import OutboxDatabase, OutboxDb
from outbox_pipelines.defs.table_health import health_materialization, message_rows_metadata

# A table is recorded when its checks' grades change, and otherwise at least this often; at most
# RECORD_AT_MOST tables a tick (nine events each: half a second to a second and a half on a busy host).
RECORD_EVERY_S = 300.0
RECORD_AT_MOST = 4
SWEEP_EVERY_S = 15


def table_events(
    table_name: str, verdicts: list[CheckVerdict], extra: Mapping[str, dict[str, Any]]
) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """The table's state, then its check evaluations (the Catalog counts the checks recorded after the state),
    ``extra`` metadata by check (the messages of dead_letters and blocked_keys)."""
    key = table_asset_key(table_name)
    return [
        health_materialization(table_name, verdicts),
        *(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=verdict.name,
                passed=verdict.passed,
                severity=SEVERITY.get(verdict.severity, dg.AssetCheckSeverity.WARN),
                description=verdict.description,
                metadata={**check_metadata(verdict.metadata), **extra.get(verdict.name, {})},
            )
            for verdict in verdicts
        ),
    ]


def recorded_events(
    outbox_db: OutboxDatabase, verdicts: Mapping[str, list[CheckVerdict]], tables: list[str]
) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """The events of ``tables``; their messages read over one connection, for those that have dead or blocked ones."""
    events: list[dg.AssetMaterialization | dg.AssetCheckEvaluation] = []
    with outbox_db.engine().connect() as conn:
        for table_name in tables:
            extra = message_rows_metadata(driver_connection(conn), table_name, verdicts[table_name])
            events += table_events(table_name, verdicts[table_name], extra)
    return events


def _fail_runs_of_dead_relays(instance: dg.DagsterInstance, report: SweepReport) -> None:
    for relay in report.dead_relays:
        if not relay.run_id:
            continue
        run = instance.get_run_by_id(relay.run_id)
        if run is None or run.is_finished:
            continue
        instance.add_run_tags(run.run_id, {FAILURE_TAG: "relay_died", "outbox/outcome": "relay_died"})
        instance.report_run_failed(run, message=relay.describe())


@dg.sensor(
    name="outbox_oncall",
    minimum_interval_seconds=SWEEP_EVERY_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        f"Every {SWEEP_EVERY_S} s: evaluates every table's checks and records them on the table assets with the "
        f"table's state (healthy / warning / failing; when they change, else every {duration_words(RECORD_EVERY_S)}), "
        "returns the rows of relays that died, and posts alerts to OUTBOX_ALERT_WEBHOOK_URL when a check turns "
        "WARN/ERROR (once), stays so (a reminder every OUTBOX_ALERT_REPEAT, default 30 min) or recovers "
        "(resolved). Its cursor lists the tables that do not pass."
    ),
)
def oncall_sensor(context: dg.SensorEvaluationContext, outbox_db: OutboxDb) -> dg.SensorResult:
    report = outbox_db.sweep()
    _fail_runs_of_dead_relays(context.instance, report)
    due, recorded = tables_to_record(
        report.verdicts,
        Recorded.parse(context.cursor),
        every_s=RECORD_EVERY_S,
        tick_s=SWEEP_EVERY_S,
        most=RECORD_AT_MOST,
    )
    events = recorded_events(outbox_db, report.verdicts, due) if due else []
    told = ", ".join(f"{a['status']} {a['alert_key']}" for a in report.alerts)
    summary = f"alerts: {told}" if told else "no change to announce"
    summary += f"; recorded {len(due)} table{'' if len(due) == 1 else 's'}" if due else ""
    if report.problems:
        summary += "; " + "; ".join(report.problems)
    return dg.SensorResult(asset_events=events, cursor=recorded.render(), skip_reason=summary)
