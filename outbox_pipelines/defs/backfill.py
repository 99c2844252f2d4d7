"""backfill_job: re-deliver the sent messages of one day (a partition) to a chosen destination.

What the launch names (the day, the table, a destination URL) is checked before the database is touched; a
mistake is a refused launch naming it (``RefusedLaunch``, defs/common.py), not a failure that pages.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
from pydantic import Field

from outbox_pipelines.core.operations.backfill import redeliver_sent
from outbox_pipelines.core.settings.values import MAX_WHOLE
from outbox_pipelines.defs.common import LaunchConfig, RefusedLaunch, metadata_values, resolve_table
from outbox_pipelines.defs.resources import Destinations, OutboxDb

# end_offset=1: today's (still open) day can be backfilled too.
BACKFILL_PARTITIONS = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC", end_offset=1)


class BackfillConfig(LaunchConfig):
    table: str = Field(
        default="", description="Outbox table whose sent messages to deliver again (one the project declares)."
    )
    # A bound the config schema cannot express; LaunchConfig turns a violation into a refused launch.
    batch_size: int = Field(
        default=500, ge=1, le=MAX_WHOLE, description=f"Messages read and delivered per batch (1 to {MAX_WHOLE})."
    )


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


@dg.op(
    description="Deliver again, with the same idempotency keys, the messages sent on the partition's day.",
    out=dg.Out(dg.Nothing),
)
def backfill_op(
    context: dg.OpExecutionContext, config: BackfillConfig, outbox_db: OutboxDb, outbox_destinations: Destinations
) -> Iterator[dg.Output[None]]:
    day = partition_day(context)  # before anything else: the day is what the launch is about
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    window = context.partition_time_window
    # The table's own destination: where messages go is the deployment's to decide, never a launch's.
    destination = outbox_destinations.for_table(table, settings)
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
                "found": report.found,
                "delivered": report.delivered,
                "failed": report.failed,
                "failures_by_code": report.failures_by_code or None,
                "failed_ids": report.failed_ids[:1000] or None,
            }
        ),
    )


def backfill_jobs() -> list[dg.JobDefinition]:
    @dg.job(
        description="Re-deliver one day's sent messages (partitioned by day).",
        partitions_def=BACKFILL_PARTITIONS,
        executor_def=dg.in_process_executor,
    )
    def backfill_job() -> None:
        backfill_op()

    return [backfill_job]
