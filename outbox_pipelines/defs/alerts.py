"""Alerts: a failed run, and a check at WARN or ERROR, posted as JSON to OUTBOX_ALERT_WEBHOOK_URL."""

from typing import Any, Dict, List

import dagster as dg

from outbox_pipelines.core.alerts import post_alert


@dg.run_failure_sensor(
    name="outbox_run_failure_alert",
    description="Posts every failed run to OUTBOX_ALERT_WEBHOOK_URL (logs only when unset).",
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def run_failure_alert(context: dg.RunFailureSensorContext):
    run = context.dagster_run
    post_alert({
        "kind": "run_failure",
        "job": run.job_name,
        "run_id": run.run_id,
        "tags": dict(run.tags),
        "error": context.failure_event.message if context.failure_event else None,
        "summary": f"Dagster run {run.run_id[:8]} of {run.job_name} failed",
    })


def failed_checks(instance: dg.DagsterInstance, run_id: str) -> List[Dict[str, Any]]:
    """The WARN/ERROR check evaluations a run produced."""
    found = []
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = record.dagster_event.event_specific_data if record.dagster_event else None
        if evaluation is None or evaluation.passed:
            continue
        found.append({
            "asset": evaluation.asset_key.to_user_string(),
            "check": evaluation.check_name,
            "severity": evaluation.severity.value,
            "description": evaluation.description,
            "metadata": {k: getattr(v, "value", str(v)) for k, v in evaluation.metadata.items()},
        })
    return found


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    name="outbox_check_alert",
    description="After any run that evaluated checks, posts those at WARN or ERROR to OUTBOX_ALERT_WEBHOOK_URL.",
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def check_alert(context: dg.RunStatusSensorContext):
    failed = failed_checks(context.instance, context.dagster_run.run_id)
    if not failed:
        return dg.SkipReason("no check at WARN or ERROR")
    worst = "ERROR" if any(f["severity"] == "ERROR" for f in failed) else "WARN"
    post_alert({
        "kind": "check_failure",
        "severity": worst,
        "run_id": context.dagster_run.run_id,
        "checks": failed,
        "summary": f"{len(failed)} outbox checks at {worst}: "
        + ", ".join(f"{f['asset']}:{f['check']}" for f in failed),
    })
