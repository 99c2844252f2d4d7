"""Schedules and sensors that keep relaying continuous and the tables healthy."""

import dagster as dg

from outbox_pipelines.defs.relay import OVERLAP_S, relay_job_name, run_minutes
from outbox_pipelines.defs.resources import TABLE_TAG, OutboxDb

ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
RUNNING = dg.DefaultScheduleStatus.RUNNING


def relay_schedules(table_names: list[str], jobs: dict[str, dg.JobDefinition]) -> list[dg.ScheduleDefinition]:
    """Every OUTBOX_RELAY_RUN_MINUTES (default 30) a relay run starts for each table and relays that long
    plus a minute: consecutive runs overlap, so at steady state one is always active and a hand-off
    leaves no gap. The per-table run limit in dagster.yaml (2) keeps them from piling up."""
    minutes = run_minutes()
    cron = "0 * * * *" if minutes == 60 else f"*/{minutes} * * * *"
    return [
        dg.ScheduleDefinition(
            name=f"relay_{table_name}_every_{minutes}_minutes",
            job=jobs[relay_job_name(table_name)],
            cron_schedule=cron,
            default_status=RUNNING,
            description=f"Keeps a relay run active for {table_name}: a run every {minutes} min that relays for "
                        f"{minutes} min + {OVERLAP_S:.0f} s, so the next one takes over without a gap.",
        )
        for table_name in table_names
    ]


def backlog_sensor(table_name: str, job: dg.JobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"relay_{table_name}_on_backlog",
        job=job,
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Starts a relay run for {table_name} when messages are ready and no relay run is active.",
    )
    def _sensor(context: dg.SensorEvaluationContext, outbox_db: OutboxDb) -> dg.SkipReason | dg.RunRequest:
        active = context.instance.get_runs(
            filters=dg.RunsFilter(tags={TABLE_TAG: table_name}, statuses=ACTIVE), limit=1)
        if active:
            return dg.SkipReason(f"relay run {active[0].run_id[:8]} is active for {table_name}")
        settings = outbox_db.settings()
        ready = outbox_db.ready_count(settings.table(table_name))
        if ready == 0:
            return dg.SkipReason(f"no ready messages in {table_name}")
        return dg.RunRequest(tags={TABLE_TAG: table_name, "outbox/trigger": "backlog"})

    return _sensor


def maintenance_schedules(jobs: dict[str, dg.JobDefinition]) -> list[dg.ScheduleDefinition]:
    return [
        dg.ScheduleDefinition(name="requeue_stuck_every_5_minutes", job=jobs["requeue_stuck_job"],
                              cron_schedule="*/5 * * * *", default_status=RUNNING,
                              description="Returns rows whose relay died (lease expired) to pending."),
        dg.ScheduleDefinition(name="clean_hourly", job=jobs["clean_job"], cron_schedule="7 * * * *",
                              default_status=RUNNING,
                              description="Deletes sent rows past each table's retention and expired ledger rows."),
        dg.ScheduleDefinition(name="prune_run_history_daily", job=jobs["prune_run_history_job"],
                              cron_schedule="17 3 * * *", default_status=RUNNING,
                              description="Deletes Dagster runs older than 14 days (relay runs add up)."),
    ]
