"""backfill_job: re-deliver the sent messages of one day (a partition) to a chosen destination."""

from collections.abc import Iterator

import dagster as dg

from outbox_pipelines.core.backfill import redeliver_sent
from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.orders import ORDERS_TABLE
from outbox_pipelines.defs.common import metadata_values, resolve_table
from outbox_pipelines.defs.resources import Destinations, OutboxDb

# end_offset=1: today's (still open) day can be backfilled too.
BACKFILL_PARTITIONS = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC", end_offset=1)


class BackfillConfig(dg.Config):
    table: str = ORDERS_TABLE
    destination_url: str | None = None  # default: the table's own destination
    batch_size: int = 500


@dg.op(description="Deliver again, with the same idempotency keys, the messages sent on the partition's day.",
       out=dg.Out(dg.Nothing))
def backfill_op(context: dg.OpExecutionContext, config: BackfillConfig, outbox_db: OutboxDb,
                outbox_destinations: Destinations) -> Iterator[dg.Output[None]]:
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    window = context.partition_time_window
    destination: Destination
    if config.destination_url:
        destination = HttpDestination(config.destination_url, timeout_s=table.timeout_s,
                                      max_in_flight=table.requests_in_flight)
    else:
        destination = outbox_destinations.for_table(table, settings)
    context.log.info(f"re-delivering {table.name} messages sent in [{window.start}, {window.end}) "
                     f"to {destination.name}")
    try:
        report = redeliver_sent(outbox_db.database_url(), table.name, destination, window.start, window.end,
                                batch_size=config.batch_size, progress=context.log.info,
                                actor=f"dagster:{context.run_id[:8]}")
    finally:
        destination.close()
    if report.found == 0:
        context.log.warning(f"{table.name}: no message was sent on {context.partition_key}; nothing to backfill")
    elif report.failed:
        context.log.warning(f"{table.name}: {report.failed} of {report.found} deliveries failed: "
                            f"{report.failures_by_code}")
    yield dg.Output(None, metadata=metadata_values({
        "table": table.name, "day": context.partition_key, "destination": destination.name, "found": report.found,
        "delivered": report.delivered, "failed": report.failed, "failures_by_code": report.failures_by_code or None,
        "failed_ids": report.failed_ids[:1000] or None,
    }))


def backfill_jobs() -> list[dg.JobDefinition]:
    @dg.job(description="Re-deliver one day's sent messages (partitioned by day).",
            partitions_def=BACKFILL_PARTITIONS, executor_def=dg.in_process_executor)
    def backfill_job() -> None:
        backfill_op()

    return [backfill_job]
