"""Schedules and sensors that keep relaying continuous and the tables healthy."""

import dagster as dg

from outbox_pipelines.defs.relay import OVERLAP_S, run_minutes
from outbox_pipelines.defs.relay_group import GROUP_TAG, relay_group_job_name
from outbox_pipelines.defs.resources import OutboxDb

ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
RUNNING = dg.DefaultScheduleStatus.RUNNING


def relay_schedules(groups: dict[str, list[str]], jobs: dict[str, dg.JobDefinition]) -> list[dg.ScheduleDefinition]:
    """Every OUTBOX_RELAY_RUN_MINUTES (default 30) a run starts for each relay group and relays that long plus a
    minute: consecutive runs overlap, so at steady state one is always active and a hand-off leaves no gap. The
    per-group run limit in dagster.yaml (2) keeps them from piling up."""
    minutes = run_minutes()
    cron = "0 * * * *" if minutes == 60 else f"*/{minutes} * * * *"
    return [
        dg.ScheduleDefinition(
            name=f"relay_group_{group}_every_{minutes}_minutes",
            job=jobs[relay_group_job_name(group)],
            cron_schedule=cron,
            default_status=RUNNING,
            description=f"Keeps a relay run active for group {group} ({len(tables)} tables): a run every {minutes} "
            f"min that relays for {minutes} min + {OVERLAP_S:.0f} s, so the next one takes over "
            "without a gap.",
        )
        for group, tables in sorted(groups.items())
    ]


def backlog_sensor(group: str, tables: list[str], job: dg.JobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"relay_group_{group}_on_backlog",
        job=job,
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Starts a run of relay group {group} when one of its tables has messages ready and no run of "
        "the group is active (after a crash, or on a fresh start).",
    )
    def _sensor(context: dg.SensorEvaluationContext, outbox_db: OutboxDb) -> dg.SkipReason | dg.RunRequest:
        active = context.instance.get_runs(filters=dg.RunsFilter(tags={GROUP_TAG: group}, statuses=ACTIVE), limit=1)
        if active:
            return dg.SkipReason(f"relay run {active[0].run_id[:8]} is active for group {group}")
        ready = outbox_db.ready_tables(tables)
        if not ready:
            return dg.SkipReason(f"no ready messages in group {group}")
        return dg.RunRequest(tags={"outbox/trigger": "backlog"})

    return _sensor


def maintenance_schedules(jobs: dict[str, dg.JobDefinition]) -> list[dg.ScheduleDefinition]:
    """Maintenance never waits behind relay runs: they are capped in dagster.yaml (outbox/kind=relay) below the
    deployment's run limit, and these jobs carry a higher dagster/priority (defs/maintenance.py)."""
    return [
        dg.ScheduleDefinition(
            name="requeue_stuck_every_5_minutes",
            job=jobs["requeue_stuck_job"],
            cron_schedule="*/5 * * * *",
            default_status=RUNNING,
            description="Returns rows whose relay died (lease expired) to pending.",
        ),
        dg.ScheduleDefinition(
            name="clean_hourly",
            job=jobs["clean_job"],
            cron_schedule="7 * * * *",
            default_status=RUNNING,
            description="Deletes sent rows past each table's retention and expired ledger rows.",
        ),
        dg.ScheduleDefinition(
            name="prune_run_history_daily",
            job=jobs["prune_run_history_job"],
            cron_schedule="17 3 * * *",
            default_status=RUNNING,
            description="Deletes Dagster runs older than 14 days (relay runs add up).",
        ),
    ]
