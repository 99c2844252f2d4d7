"""On-call in Dagster: the sensor that keeps the checks current and tells people what changed.

``outbox_oncall`` runs the core's on-call sweep every 15 s (dead relays, every table's checks, fire / remind /
resolve), records the check evaluations on the table assets (so the UI shows them without a run), and marks the runs
of dead relays failed (defs/alerts.py tells about the other failed runs).
"""

import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from outbox_pipelines.core.oncall.sweep import SweepReport
from outbox_pipelines.defs.alerts import FAILURE_TAG
from outbox_pipelines.defs.checks import SEVERITY, check_metadata
from outbox_pipelines.defs.common import table_asset_key
from outbox_pipelines.defs.resources import OutboxDb

# A check evaluation is recorded when its severity changes, and otherwise at most this often.
RECORD_EVERY_S = 60.0
SWEEP_EVERY_S = 15


def _check_evaluations(
    report: SweepReport, recorded: dict[str, list[Any]], now: float
) -> list[dg.AssetCheckEvaluation]:
    events = []
    for table_name, verdicts in report.verdicts.items():
        for verdict in verdicts:
            key = f"{table_name}:{verdict.name}"
            last_severity, last_at = recorded.get(key, (None, 0.0))
            if last_severity == verdict.severity and now - last_at < RECORD_EVERY_S:
                continue
            recorded[key] = [verdict.severity, now]
            events.append(
                dg.AssetCheckEvaluation(
                    asset_key=table_asset_key(table_name),
                    check_name=verdict.name,
                    passed=verdict.passed,
                    severity=SEVERITY.get(verdict.severity, dg.AssetCheckSeverity.WARN),
                    description=verdict.description,
                    metadata=check_metadata(verdict.metadata),
                )
            )
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
        f"Every {SWEEP_EVERY_S} s: evaluates every table's checks (shown on the table assets), returns "
        "the rows of relays that died, and posts alerts to OUTBOX_ALERT_WEBHOOK_URL when a check turns "
        "WARN/ERROR (once), stays so (a reminder every OUTBOX_ALERT_REPEAT, default 30 min) or recovers "
        "(resolved)."
    ),
)
def oncall_sensor(context: dg.SensorEvaluationContext, outbox_db: OutboxDb) -> dg.SensorResult:
    report = outbox_db.sweep()
    _fail_runs_of_dead_relays(context.instance, report)
    state = json.loads(context.cursor) if context.cursor else {}
    recorded = state.get("recorded", {})
    events = _check_evaluations(report, recorded, datetime.now(UTC).timestamp())
    told = ", ".join(f"{a['status']} {a['alert_key']}" for a in report.alerts)
    summary = f"alerts: {told}" if told else "no change to announce"
    if report.problems:
        summary += "; " + "; ".join(report.problems)
    return dg.SensorResult(asset_events=events, cursor=json.dumps({"recorded": recorded}), skip_reason=summary)
