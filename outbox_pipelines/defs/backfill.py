"""backfill_job: re-deliver the sent messages of one day (a partition) to the table's own destination.

A dry run by default, as replay and skip: it counts what it would deliver, per topic, lists the first event
ids and delivers nothing; run for real, it audits the launch's ``reason`` (outbox_backfill). What the launch
names (the day, the table) is checked before the database is touched; a mistake is a refused launch naming it
(``RefusedLaunch``, defs/common.py), not a failure that pages.
"""

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg
from pydantic import Field, field_validator

from outbox_pipelines.core.operations.backfill import redeliver_sent
from outbox_pipelines.core.operations.backfill_preview import FIRST_LIMIT, preview_sent
from outbox_pipelines.core.settings.values import MAX_WHOLE
from outbox_pipelines.defs.common import (
    LaunchConfig,
    RefusedLaunch,
    audited_reason,
    launch_schema,
    metadata_values,
    resolve_table,
)
from outbox_pipelines.defs.replay import DRY_RUN_TAG
from outbox_pipelines.defs.resources import Destinations, OutboxDb

# end_offset=1: today's (still open) day can be backfilled too.
BACKFILL_PARTITIONS = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC", end_offset=1)


class BackfillConfig(LaunchConfig):
    """Which table's sent messages of the run's day (its partition) to deliver again, and whether for real."""

    table: str = Field(default="", description="Outbox table whose sent messages to deliver again.")
    dry_run: bool = Field(
        default=True,
        description=(
            "true (the default): only count what would be delivered again, per topic, and list the first "
            f"{FIRST_LIMIT} event ids; deliver and change nothing. Set false to deliver. "
            "The run is tagged outbox/dry_run=true or false."
        ),
    )
    reason: str = Field(
        default="backfilled by an operator",
        description="Why: kept in the audit row (outbox_backfill) when run for real.",
    )
    # A bound the config schema cannot express; LaunchConfig turns a violation into a refused launch.
    batch_size: int = Field(
        default=500, ge=1, le=MAX_WHOLE, description=f"Messages read and delivered per batch (1 to {MAX_WHOLE})."
    )

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        return audited_reason(value)


def _days() -> str:
    """The days a run can take, and one to copy (yesterday, the last whole day)."""
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    first, last = BACKFILL_PARTITIONS.get_first_partition_key(), BACKFILL_PARTITIONS.get_last_partition_key()
    return f"a day from {first} to {last} written YYYY-MM-DD, e.g. {yesterday}"


def partition_day(context: dg.OpExecutionContext) -> str:
    """The run's day; a run without one, or with a key that is not a day of the partitions, is refused."""
    if not context.has_partition_key:
        raise RefusedLaunch(
            "partition",
            (
                f"partition: backfill_job re-delivers one day's sent messages and no day was chosen; pick {_days()}, "
                "in the launchpad's partition selector or as the tag dagster/partition"
            ),
        )
    day = context.partition_key
    if not BACKFILL_PARTITIONS.has_partition_key(day):
        raise RefusedLaunch("partition", f"partition: {day!r} is not a day backfill_job knows; pick {_days()}")
    return day


def _dry_run(
    context: dg.OpExecutionContext, outbox_db: OutboxDb, table: str, destination: str, day: str
) -> Iterator[dg.Output[None]]:
    window = context.partition_time_window
    preview = preview_sent(outbox_db.database_url(), table, window.start, window.end, destination=destination)
    context.log.info(preview.summary)
    if preview.found == 0:
        context.log.warning(f"{table}: no message was sent on {day}; a backfill would deliver nothing")
    metadata = metadata_values(
        {
            "table": table,
            "day": day,
            "destination": destination,
            "dry_run": True,
            "found": preview.found,
            "by_topic": preview.by_topic or None,
            "first_event_ids": [row.event_id for row in preview.first] or None,
            "summary": preview.summary,
        }
    )
    metadata["rows"] = dg.MetadataValue.md(
        f"**Would re-deliver {preview.found}** messages of `{table}` sent on {day} to {destination} "
        f"(dry run: nothing delivered; set dry_run: false to deliver)\n\n{preview.rows_markdown()}"
    )
    yield dg.Output(None, metadata=metadata)


def run_backfill(
    context: dg.OpExecutionContext, config: BackfillConfig, outbox_db: OutboxDb, outbox_destinations: Destinations
) -> Iterator[dg.Output[None]]:
    """The body of backfill_op: the day and table checked, then a dry run's counts or the deliveries."""
    day = partition_day(context)  # before anything else: the day is what the launch is about
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    context.instance.add_run_tags(context.run_id, {DRY_RUN_TAG: "true" if config.dry_run else "false"})
    window = context.partition_time_window
    # The table's own destination: where messages go is the deployment's to decide, never a launch's.
    destination = outbox_destinations.for_table(table, settings)
    if config.dry_run:
        destination.close()
        yield from _dry_run(context, outbox_db, table.name, destination.name, day)
        return
    context.log.info(
        f"re-delivering {table.name} messages sent in [{window.start}, {window.end}) to {destination.name}"
    )
    try:
        report = redeliver_sent(
            outbox_db.database_url(),
            table.name,
            destination,
            window.start,
            window.end,
            batch_size=config.batch_size,
            progress=context.log.info,
            actor=f"dagster:{context.run_id[:8]}",
            reason=config.reason,
        )
    finally:
        destination.close()
    if report.found == 0:
        context.log.warning(f"{table.name}: no message was sent on {day}; nothing to backfill")
    elif report.failed:
        context.log.warning(
            f"{table.name}: {report.failed} of {report.found} deliveries failed: {report.failures_by_code}"
        )
    yield dg.Output(
        None,
        metadata=metadata_values(
            {
                "table": table.name,
                "day": day,
                "destination": destination.name,
                "dry_run": False,
                "found": report.found,
                "delivered": report.delivered,
                "failed": report.failed,
                "failures_by_code": report.failures_by_code or None,
                "failed_ids": report.failed_ids[:1000] or None,
            }
        ),
    )


def backfill_jobs(tables: Sequence[str] = ()) -> list[dg.JobDefinition]:
    """backfill_job, its table one of ``tables`` (the code location's)."""

    @dg.op(
        description="Deliver again, with the same idempotency keys, the messages sent on the partition's day.",
        config_schema=launch_schema(BackfillConfig, tables),
        out=dg.Out(dg.Nothing),
    )
    def backfill_op(
        context: dg.OpExecutionContext, outbox_db: OutboxDb, outbox_destinations: Destinations
    ) -> Iterator[dg.Output[None]]:
        yield from run_backfill(context, BackfillConfig(**context.op_config), outbox_db, outbox_destinations)

    @dg.job(
        description=(
            "Re-deliver one day's sent messages (partitioned by day) to each table's own destination. Dry run by "
            "default: look at the op's 'rows' metadata (counts per topic, first event ids), then run again with "
            "dry_run: false."
        ),
        partitions_def=BACKFILL_PARTITIONS,
        executor_def=dg.in_process_executor,
    )
    def backfill_job() -> None:
        backfill_op()

    return [backfill_job]
