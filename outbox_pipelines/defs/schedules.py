"""Schedules and sensors that keep relaying continuous and the tables healthy."""

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from outbox_pipelines.core import wings
from outbox_pipelines.core.operations.maintenance_due import clean_due, requeue_due
from outbox_pipelines.core.settings import GlobalSettings, TableSettings
from outbox_pipelines.core.storage.db import driver_connection
from outbox_pipelines.core.storage.table import SharedTables
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
# The cleaner's pass over the wings' shared tables (their expiry is theirs to know): at least once a day.
SHARED_PASS_EVERY_S = 86400.0


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


def _active_run(context: dg.ScheduleEvaluationContext, job_name: str) -> str | None:
    """The id (8 characters) of a run of ``job_name`` queued or in progress, else None."""
    runs = context.instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE), limit=1)
    return runs[0].run_id[:8] if runs else None


def _existing(outbox_db: OutboxDb, conn: Any) -> list[TableSettings]:
    """The configured tables that exist in the database (a missing one is its relay check's to report)."""
    existing = set(SharedTables(conn).outbox_table_names())
    settings = outbox_db.settings()
    return [settings.tables[name] for name in sorted(settings.tables) if name in existing]


def _said(due: dict[str, str]) -> str:
    return "; ".join(f"{name}: {why}" for name, why in sorted(due.items()))


def requeue_stuck_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    @dg.schedule(
        name="requeue_stuck_every_5_minutes",
        job=job,
        cron_schedule="*/5 * * * *",
        default_status=RUNNING,
        description="Every 5 min, asks each table whether a row is stuck in sending (its relay died: lease expired, "
        "or past the stuck threshold) or an ordering key waits with nothing before it, and launches "
        "requeue_stuck_job for those tables only; a tick that finds nothing is skipped, and leaves no run.",
    )
    def _schedule(context: dg.ScheduleEvaluationContext, outbox_db: OutboxDb) -> dg.SkipReason | dg.RunRequest:
        active = _active_run(context, job.name)
        if active:
            return dg.SkipReason(f"requeue_stuck_job run {active} is still active")
        with outbox_db.engine().connect() as pooled:
            conn = driver_connection(pooled)
            due = requeue_due(conn, _existing(outbox_db, conn))
        if not due:
            return dg.SkipReason("nothing stuck: no row past its lease or the stuck threshold, no key left waiting")
        return dg.RunRequest(
            run_config={"ops": {"requeue_stuck_op": {"config": {"tables": sorted(due)}}}},
            tags={"outbox/trigger": "stuck_rows"},
        )

    return _schedule


def clean_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    @dg.schedule(
        name="clean_hourly",
        job=job,
        cron_schedule="7 * * * *",
        default_status=RUNNING,
        description="Every hour, asks each table whether sent or dead rows are past their retention (and the audit "
        "whether its rows are), and launches clean_job when some are; once a day regardless, for the wings' shared "
        "tables (the order ledger's expired rows). A tick that finds nothing is skipped, and leaves no run.",
    )
    def _schedule(context: dg.ScheduleEvaluationContext, outbox_db: OutboxDb) -> dg.SkipReason | dg.RunRequest:
        active = _active_run(context, job.name)
        if active:
            return dg.SkipReason(f"clean_job run {active} is still active")
        env = GlobalSettings.from_env()
        with outbox_db.engine().connect() as pooled:
            conn = driver_connection(pooled)
            tables = _existing(outbox_db, conn)
            due = clean_due(
                conn,
                tables,
                dead_retention_s=env.cleaner_dead_retention_s,
                audit_retention_s=env.audit_retention_s,
                inboxes=list(outbox_db.settings().inboxes.values()),
            )
        if not due and wings.shared_cleanups() and any(table.cleaner_enabled for table in tables):
            since = datetime.now(UTC) - timedelta(seconds=SHARED_PASS_EVERY_S)
            if not context.instance.get_run_records(
                filters=dg.RunsFilter(job_name=job.name, created_after=since), limit=1
            ):
                due = {", ".join(wings.shared_cleanups()): "the daily pass over shared tables"}
        if not due:
            return dg.SkipReason("nothing past its retention: no sent, dead or audit row to delete")
        return dg.RunRequest(tags={"outbox/trigger": "retention"})

    return _schedule


def maintenance_schedules(jobs: dict[str, dg.JobDefinition]) -> list[dg.ScheduleDefinition]:
    """Maintenance never waits behind relay runs: they are capped in dagster.yaml (outbox/kind=relay) below the
    deployment's run limit, and these jobs carry a higher dagster/priority (defs/maintenance.py). The requeue
    and cleaner schedules ask the database first (core/operations/maintenance_due.py) and launch a run only
    when there is work: an idle deployment leaves one prune run a day, not 313 maintenance runs."""
    return [
        requeue_stuck_schedule(jobs["requeue_stuck_job"]),
        clean_schedule(jobs["clean_job"]),
        dg.ScheduleDefinition(
            name="prune_run_history_daily",
            job=jobs["prune_run_history_job"],
            cron_schedule="17 3 * * *",
            default_status=RUNNING,
            description="Deletes the outbox jobs' Dagster runs older than 14 days (relay runs add up).",
        ),
    ]
