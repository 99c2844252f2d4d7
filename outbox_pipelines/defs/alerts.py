"""On-call in Dagster: the sensor that tells people about failed runs (the one that keeps the checks current
is defs/oncall_sensor.py).

``outbox_run_failure_alert`` tells about any failed run with its root cause; a cancelled run alerts nobody, and a
refused launch is one ``info`` note, never a page. Why: docs/explanation/on-call.md, "Failed runs".
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from outbox_pipelines.core.oncall.alerts import AlertSeverity, Condition, announce_event
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.defs.common import REFUSED_INPUT, refused_config_text
from outbox_pipelines.defs.links import DagsterLinks
from outbox_pipelines.defs.relay_group import GROUP_TAG, KIND_TAG, RELAY_KIND
from outbox_pipelines.defs.resources import TABLE_TAG, OutboxDb


def run_link(run_id: str) -> dict[str, str]:
    """A condition's link to the run in the Dagster UI, and its words."""
    return {"link": DagsterLinks().run(run_id), "link_label": DagsterLinks.label}


# Tags a run the on-call sweep already told people about (its relay died).
FAILURE_TAG = "outbox/failure"


@dataclass(frozen=True)
class RootCause:
    text: str
    refused_input: str | None = None  # the launch field an operator got wrong: a refused launch, not a fault


def _refused_field(user: Any) -> str | None:
    """The field a RefusedLaunch named (its Failure metadata), if the step failure is one."""
    value = (user.metadata or {}).get(REFUSED_INPUT) if user is not None else None
    return str(getattr(value, "value", value)) if value is not None else None


def _root_cause(instance: dg.DagsterInstance, run_id: str, fallback: str | None) -> RootCause:
    """The first step failure's own message (not Dagster's 'Steps failed: [...]'), and whether it refused input."""
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        event = record.dagster_event
        data = event.step_failure_data if event is not None else None
        if data is not None and data.error is not None:
            cause = data.error.cause or data.error
            while cause.cause is not None and "dagster" in (cause.cls_name or "").lower():
                cause = cause.cause
            user = data.user_failure_data
            if user is not None and user.description:
                return RootCause(user.description, _refused_field(user))
            # A config class that is not a LaunchConfig: pydantic refused the launch; say it plainly, no dump.
            refused = refused_config_text(cause.message) if cause.cls_name == "ValidationError" else None
            if refused is not None:
                return RootCause(refused[1], refused[0])
            return RootCause(f"{cause.cls_name}: {cause.message.strip()}")
    return RootCause(fallback or "the run failed before any step (see its logs)")


def _refused_launch_note(context: dg.RunFailureSensorContext, cause: RootCause) -> dg.SkipReason:
    """A refused launch: one note at severity info, no page; the run is tagged so the Runs page can filter."""
    run = context.dagster_run
    context.instance.add_run_tags(run.run_id, {FAILURE_TAG: "refused_launch"})
    announce_event(
        Condition(
            key=f"run:{run.run_id}",
            severity=AlertSeverity.INFO,
            kind="run_failure",
            **run_link(run.run_id),
            table=run.tags.get(TABLE_TAG),
            job=run.job_name,
            run_id=run.run_id,
            summary=(
                f"{run.job_name}: launch refused (run {run.run_id[:8]}), nothing was changed: "
                f"{redact_text(cause.text)[:1000].rstrip('.')}. Whoever launched it can fix the field "
                f"{cause.refused_input} and launch again; nothing to do on call."
            ),
            figures={"refused_input": cause.refused_input},
        ),
        now=datetime.now(UTC),
    )
    return dg.SkipReason(f"run {run.run_id[:8]} was a refused launch ({cause.refused_input}); told as a note")


@dg.run_failure_sensor(
    name="outbox_run_failure_alert",
    description="Posts each failed run to OUTBOX_ALERT_WEBHOOK_URL with its root cause and a link (logged when "
    "unset). Cancelled runs are not failures; relay deaths are told by outbox_oncall; a launch "
    "refused for its input is a note (severity info), not an error.",
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=10,
    monitor_all_code_locations=False,
)
def run_failure_alert(context: dg.RunFailureSensorContext, outbox_db: OutboxDb) -> dg.SkipReason | None:
    run = context.dagster_run
    if run.tags.get(FAILURE_TAG):
        return dg.SkipReason(f"run {run.run_id[:8]} already reported ({run.tags[FAILURE_TAG]})")
    if run.tags.get(KIND_TAG) == RELAY_KIND or run.tags.get(TABLE_TAG):
        # A relay run (a group's or one table's) whose relays never said goodbye died with its process: one
        # "relay died" alert, with what they held, and their rows back now.
        told = outbox_db.relays_died_with_run(run.run_id)
        if told:
            context.instance.add_run_tags(run.run_id, {FAILURE_TAG: "relay_died", "outbox/outcome": "relay_died"})
            return dg.SkipReason(f"run {run.run_id[:8]}: its relay died; told as relay_died")
    fallback = context.failure_event.message if context.failure_event else None
    root = _root_cause(context.instance, run.run_id, fallback)
    if root.refused_input is not None:
        return _refused_launch_note(context, root)
    cause = redact_text(root.text)[:1000]
    if cause.startswith("DagsterExecutionInterruptedError"):
        # Interrupted by a stop (a run that started while `dev` was stopping): the relay settled its batch
        # on the way out; a stop is not a fault. A killed relay raises nothing and is told as relay_died.
        context.instance.add_run_tags(run.run_id, {FAILURE_TAG: "interrupted_by_stop"})
        # Shown as what it was: the same status a Terminate or a stop mid-relay gives.
        context.instance.report_run_canceled(
            run, message="Interrupted by a stop (outbox-pipelines dev or the daemon was stopping): not a failure."
        )
        return dg.SkipReason(f"run {run.run_id[:8]} was interrupted by a stop, not failed; marked canceled")
    table_name, group = run.tags.get(TABLE_TAG), run.tags.get(GROUP_TAG)
    stats = context.instance.get_run_stats(run.run_id)
    ran_s = (stats.end_time - stats.start_time) if stats.start_time and stats.end_time else None
    where = f" of {table_name}" if table_name else f" of relay group {group}" if group else ""
    condition = Condition(
        key=f"run:{run.run_id}",
        severity=AlertSeverity.ERROR,
        kind="run_failure",
        **run_link(run.run_id),
        table=table_name,
        job=run.job_name,
        run_id=run.run_id,
        summary=(
            f"{run.job_name}{where} failed (run {run.run_id[:8]}): {cause}. Open the run for its logs; "
            "scheduled jobs run again on their own."
        ),
        figures={"ran_s": round(ran_s, 1) if ran_s is not None else None},
    )
    announce_event(condition, now=datetime.now(UTC))
    return None
