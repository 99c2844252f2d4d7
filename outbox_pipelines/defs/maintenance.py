"""Maintenance jobs: requeue stuck rows, clean old sent rows, prune Dagster's own run history."""

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg
from pydantic import Field

from outbox_pipelines.core.errors import ConfigError, RetentionTooShort
from outbox_pipelines.core.operations.maintenance import (
    SHARED_NOT_DUE,
    clean_tables,
    requeue_stuck,
    shared_tables_cleaned,
)
from outbox_pipelines.core.settings import TableSettings, parse_duration
from outbox_pipelines.defs.common import (
    MAINTENANCE_TAGS,
    RefusedLaunch,
    metadata_values,
    resolve_table,
    table_field,
)
from outbox_pipelines.defs.resources import OutboxDb


class TablesConfig(dg.Config):
    tables: list[str] = Field(default=[], description="The outbox tables to go through; [] = every declared table.")


def tables_schema(config_class: type[TablesConfig], tables: Sequence[str]) -> dict[str, dg.Field]:
    """The op config of ``config_class``, its ``tables`` a list of the code location's tables (the Enum
    ``table_field`` offers: a typo starts no run)."""
    fields = dict(config_class.to_fields_dict())  # a copy: Dagster keeps the class's own (CleanConfig's extends it)
    description = fields["tables"].description or ""
    choice = table_field(tables, description).config_type  # a string when none is declared
    if tables:
        # Named in the description as table_field does: Dagster keeps one shape per hash of its fields' type names
        # and descriptions in a process, and the Enum's type name is the same for every code location's tables.
        description = f"{description} Each one of: {', '.join(sorted(tables))}."
    fields["tables"] = dg.Field(dg.Array(choice), default_value=[], is_required=False, description=description)
    return fields


class CleanConfig(TablesConfig):
    retention: str | None = Field(
        default=None,
        description=(
            "Keep sent rows this long, e.g. 168h (default: each table's retention). Shorter than the table's "
            "dedup horizon is refused unless force."
        ),
    )
    audit_retention: str | None = Field(
        default=None, description="Keep audit rows this long, e.g. 30d (default: OUTBOX_AUDIT_RETENTION, 30d)."
    )
    dead_retention: str | None = Field(
        default=None,
        description=(
            "Keep dead rows this long, e.g. 30d (default: OUTBOX_CLEANER_DEAD_RETENTION, 30d); a dead row that "
            "parks its ordering key is always kept."
        ),
    )
    tenant_id: str | None = Field(default=None, description="Only this tenant's sent rows.")
    force: bool = Field(
        default=False,
        description=(
            "Clean the tables whose cleaner is disabled too, and allow a retention shorter than the dedup horizon "
            "(a repeated event_id or payload may then be delivered again)."
        ),
    )


def _chosen_tables(outbox_db: OutboxDb, table_names: list[str]) -> list[TableSettings]:
    """The tables the config names, else every configured table in name order."""
    settings = outbox_db.settings()
    return [resolve_table(settings, name, field="tables") for name in (table_names or sorted(settings.tables))]


def _duration(value: str | None, field: str) -> float | None:
    """A duration the launch typed, or a refused launch naming its field (never a page)."""
    try:
        return parse_duration(value, field) if value else None
    except ConfigError as exc:
        raise RefusedLaunch(field, str(exc)) from None


def run_requeue_stuck(
    context: dg.OpExecutionContext, config: TablesConfig, outbox_db: OutboxDb
) -> Iterator[dg.Output[None]]:
    """Return sending rows whose lease expired (or stuck past the threshold) to pending."""
    tables = _chosen_tables(outbox_db, config.tables)
    changed = {}
    for table in tables:
        report = requeue_stuck(outbox_db.database_url(), table, progress=context.log.info)
        changed[table.name] = {"requeued": report.requeued, "dead_no_attempts_left": report.dead}
        if report.requeued or report.dead:
            context.log.warning(
                f"{table.name}: requeued {report.requeued}, dead {report.dead} (a relay died holding them)"
            )
    total = sum(v["requeued"] for v in changed.values())
    yield dg.Output(None, metadata=metadata_values({"requeued_total": total, "by_table": changed}))


def run_clean(context: dg.OpExecutionContext, config: CleanConfig, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
    """Delete sent rows older than the retention, dead rows and audit rows older than theirs, expired ledger rows.

    The run's rules (which tables, the retention check before any delete, force, the shared tables) are the
    core's ``clean_tables``, the CLI's ``clean`` too; this logs its report and yields its figures.
    """
    tables = _chosen_tables(outbox_db, config.tables)
    inboxes = outbox_db.settings().inboxes if not config.tables else {}  # every declared inbox (docs/how-to/inbox.md)
    retention = _duration(config.retention, "retention")
    audit_retention = _duration(config.audit_retention, "audit_retention")
    dead_retention = _duration(config.dead_retention, "dead_retention")
    try:
        report = clean_tables(
            outbox_db.database_url,
            tables,
            retention_s=retention,
            audit_retention_s=audit_retention,
            dead_retention_s=dead_retention,
            force=config.force,
            tenant_id=config.tenant_id,
            progress=context.log.info,
            inboxes=[inboxes[name] for name in sorted(inboxes)],
        )
    except RetentionTooShort as exc:
        if retention is None:  # each table's own retention: the settings are wrong, not this launch
            raise
        raise RefusedLaunch("retention", f"retention: {exc}") from None
    for outcome in report.tables:
        if outcome.skipped:
            context.log.info(f"{outcome.table}: {outcome.skipped}; skipped")
    expired: dict[str, int] = {}
    audit = 0
    if report.shared is None:
        context.log.info(f"{', '.join(shared_tables_cleaned())}: {SHARED_NOT_DUE}")
    else:
        expired, audit = report.shared.deleted_expired, report.shared.deleted_audit
    changed, dead = report.deleted_sent_by_table, report.deleted_dead_by_table
    context.log.info(f"deleted sent rows {changed}, dead rows {dead}, expired rows {expired}, audit rows {audit}")
    for name, why in report.inboxes_skipped.items():
        context.log.info(f"{name}: {why}; skipped")
    if report.inboxes:
        context.log.info(f"deleted inbox entries past their window {report.inboxes}")
    yield dg.Output(
        None,
        metadata=metadata_values(
            {
                "deleted_sent_by_table": changed,
                "deleted_sent_total": report.deleted_sent_total,
                "deleted_dead_by_table": dead,
                "deleted_expired_by_table": expired,
                "deleted_audit": audit,
                "deleted_inbox_entries_by_inbox": report.inboxes,
            }
        ),
    )


class PruneConfig(dg.Config):
    keep_days: float = 14.0
    batch: int = 500
    # Also the runs of jobs that are not the outbox's: for an instance that only the outbox uses. By default a
    # team's own jobs sharing the instance keep their history.
    every_job: bool = False


def prune_runs(
    context: dg.OpExecutionContext, config: PruneConfig, job_names: Sequence[str] | None, cutoff: datetime
) -> int:
    """Delete finished runs of ``job_names`` (None: of every job) created before ``cutoff``; how many."""
    finished = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
    deleted = 0
    for job_name in job_names if job_names is not None else [None]:
        while True:
            records = context.instance.get_run_records(
                filters=dg.RunsFilter(job_name=job_name, created_before=cutoff, statuses=finished), limit=config.batch
            )
            records = [r for r in records if r.dagster_run.run_id != context.run_id]
            if not records:
                break
            for record in records:
                context.instance.delete_run(record.dagster_run.run_id)
                deleted += 1
            context.log.info(f"deleted {deleted} runs created before {cutoff.isoformat()}")
    return deleted


def prune_run_history_job(job_names: Sequence[str]) -> dg.JobDefinition:
    """prune_run_history_job: the finished runs of the outbox's own jobs (``job_names``, this code location's)
    older than keep_days; open-source Dagster keeps runs forever."""
    names = sorted({*job_names, "prune_run_history_job"})

    @dg.op(out=dg.Out(dg.Nothing))
    def prune_run_history_op(context: dg.OpExecutionContext, config: PruneConfig) -> Iterator[dg.Output[None]]:
        """Delete the outbox jobs' finished runs older than keep_days (every job's with every_job)."""
        cutoff = datetime.now(UTC) - timedelta(days=config.keep_days)
        deleted = prune_runs(context, config, None if config.every_job else names, cutoff)
        yield dg.Output(None, metadata={"deleted_runs": deleted, "cutoff": cutoff.isoformat()})

    @dg.job(
        name="prune_run_history_job",
        description="Prune the outbox jobs' run history older than keep_days (every job's with every_job).",
        executor_def=dg.in_process_executor,
        tags=MAINTENANCE_TAGS,
    )
    def prune_job() -> None:
        prune_run_history_op()

    return prune_job


def maintenance_jobs(tables: Sequence[str] = ()) -> list[dg.JobDefinition]:
    """requeue_stuck_job and clean_job (their ``tables`` among ``tables``, the code location's); the factory adds
    ``prune_run_history_job`` once it knows every outbox job's name."""

    @dg.op(
        description="Return sending rows whose lease expired (or stuck past the threshold) to pending.",
        config_schema=tables_schema(TablesConfig, tables),
        out=dg.Out(dg.Nothing),
    )
    def requeue_stuck_op(context: dg.OpExecutionContext, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
        yield from run_requeue_stuck(context, TablesConfig(**context.op_config), outbox_db)

    @dg.op(
        description=(
            "Delete sent rows older than the retention, dead rows and audit rows older than theirs, expired "
            "ledger rows."
        ),
        config_schema=tables_schema(CleanConfig, tables),
        out=dg.Out(dg.Nothing),
    )
    def clean_op(context: dg.OpExecutionContext, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
        yield from run_clean(context, CleanConfig(**context.op_config), outbox_db)

    @dg.job(
        description="Requeue stuck rows of every table (or config.tables).",
        executor_def=dg.in_process_executor,
        tags=MAINTENANCE_TAGS,
    )
    def requeue_stuck_job() -> None:
        requeue_stuck_op()

    @dg.job(
        description="Clean sent, dead and audit rows past their retention, and expired ledger rows.",
        executor_def=dg.in_process_executor,
        tags=MAINTENANCE_TAGS,
    )
    def clean_job() -> None:
        clean_op()

    return [requeue_stuck_job, clean_job]
