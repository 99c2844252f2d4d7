"""Relay jobs: one graph, a job per table (tagged for the per-table run limit) and a generic one."""

from typing import List, Optional

import dagster as dg

from outbox_pipelines.core.relay import RelayReport, run_table_relay
from outbox_pipelines.defs.common import metadata_values, resolve_table, table_asset_key
from outbox_pipelines.defs.resources import TABLE_TAG, OutboxDatabase, OutboxDestinations

# A scheduled run relays this long, then hands over to the next (which starts
# while this one still runs: the overlap is the hand-off).
DEFAULT_RUN_SECONDS = 75.0


class RelayRunConfig(dg.Config):
    table: str = "outbox_orders"
    max_seconds: float = DEFAULT_RUN_SECONDS
    max_entries: Optional[int] = None
    once: bool = False  # drain what is ready, then end the run


def _report_metadata(report: RelayReport, mode: str) -> dict:
    values = {
        "table": report.table,
        "mode": mode,
        "worker": report.worker,
        "claimed": report.claimed,
        "sent": report.sent,
        "retried": report.retried,
        "dead": report.dead,
        "conflicts": report.conflicts,
        "dedup_hits": report.dedup_hits,
        "requeued_expired_leases": report.requeued,
        "rate_limited": report.rate_limited,
        "db_errors": report.db_errors,
        "duration_s": report.seconds,
        "throughput_per_s": report.throughput if report.seconds >= 1.0 else None,
        "stopped_because": report.stopped_because,
        "dead_by_code": ", ".join(f"{code}={n}" for code, n in sorted(report.dead_by_code.items())) or None,
    }
    if mode == "single-active":
        values["single_active_lock_held"] = report.lock_held
    return values


@dg.op(
    description="Claim, dispatch and settle one outbox table under the run's time and entry budget.",
    out=dg.Out(dg.Nothing),
)
def relay_table(
    context: dg.OpExecutionContext,
    config: RelayRunConfig,
    outbox_db: OutboxDatabase,
    outbox_destinations: OutboxDestinations,
):
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    if not table.relay_enabled:
        context.log.warning(f"relay is disabled for {table.name} (OUTBOX_RELAY_ENABLED / relay_enabled); nothing done")
        yield dg.Output(None, metadata={"table": table.name, "relay_enabled": False})
        return
    destination = outbox_destinations.for_table(table, settings)
    context.log.info(f"relaying {table.name} → {destination.name} for up to {config.max_seconds:.0f}s ({table.mode})")
    try:
        report = run_table_relay(
            outbox_db.database_url(),
            settings,
            table.name,
            max_seconds=config.max_seconds,
            max_entries=config.max_entries,
            once=config.once,
            destination=destination,
            worker_id=f"dagster:{context.run_id[:8]}",
            progress=lambda r: context.log.info(
                f"{r.table}: sent {r.sent}, retried {r.retried}, dead {r.dead}, conflicts {r.conflicts} "
                f"({r.throughput:.0f} msg/s)"
            ),
        )
    finally:
        destination.close()
    status = outbox_db.table_status(table)
    values = _report_metadata(report, table.mode)
    values.update({"lag_p50_s": status.lag_p50_s, "lag_p95_s": status.lag_p95_s, "lag_p99_s": status.lag_p99_s,
                   "backlog_after": status.backlog, "dead_total": status.counts.get("dead", 0)})
    if report.retried and not report.sent:
        context.log.warning(f"{table.name}: nothing was delivered and {report.retried} messages were retried; "
                            "is the destination down? (they stay pending and retry with backoff)")
    context.log.info(
        f"{table.name}: sent {report.sent}, retried {report.retried}, dead {report.dead}, conflicts {report.conflicts}, "
        f"dedup hits {report.dedup_hits} in {report.seconds:.1f}s; stopped: {report.stopped_because}"
    )
    metadata = metadata_values(values)
    context.log_event(dg.AssetObservation(asset_key=table_asset_key(table.name), metadata=metadata))
    yield dg.Output(None, metadata=metadata)


@dg.graph(description="Relay one outbox table.")
def relay_graph():
    relay_table()


def relay_job_name(table: str) -> str:
    return f"relay_{table}_job"


def relay_jobs(tables: List[str]) -> List[dg.JobDefinition]:
    """A job per table (its run config fixed to the table and tagged for the run limit), plus ``relay_job``."""
    jobs = [
        relay_graph.to_job(
            name=relay_job_name(table),
            description=f"Relay {table}: claim → dispatch → settle for up to {DEFAULT_RUN_SECONDS:.0f}s.",
            config={"ops": {"relay_table": {"config": {"table": table, "max_seconds": DEFAULT_RUN_SECONDS}}}},
            tags={TABLE_TAG: table},
            executor_def=dg.in_process_executor,
        )
        for table in tables
    ]
    jobs.append(
        relay_graph.to_job(
            name="relay_job",
            description="Relay any table: set ops.relay_table.config.table in the launchpad.",
            executor_def=dg.in_process_executor,
        )
    )
    return jobs
