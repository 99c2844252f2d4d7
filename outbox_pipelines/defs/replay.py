"""replay_dead_job: move dead messages back to pending by filter (dry run by default)."""

from datetime import datetime, timezone
from typing import List, Optional

import dagster as dg

from outbox_pipelines.core.replay import ReplayFilter, replay_dead
from outbox_pipelines.defs.common import metadata_values, resolve_table
from outbox_pipelines.defs.resources import OutboxDatabase


class ReplayConfig(dg.Config):
    table: str = "outbox_orders"
    ids: Optional[List[int]] = None
    topic: Optional[str] = None
    tenant_id: Optional[str] = None
    error_code: Optional[str] = None
    since: Optional[str] = None  # ISO 8601; died at or after
    until: Optional[str] = None  # ISO 8601; died before
    dry_run: bool = True  # look first: set false to replay
    force: bool = False  # also replay rows that died of BAD_REQUEST


def _time(value: Optional[str], name: str) -> Optional[datetime]:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise dg.Failure(description=f"{name}={value!r} is not an ISO 8601 time like 2026-11-21T10:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


@dg.op(description="Replay dead messages matching the filters; lists what was (or would be) replayed.", out=dg.Out(dg.Nothing))
def replay_dead_op(context: dg.OpExecutionContext, config: ReplayConfig, outbox_db: OutboxDatabase):
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    selection = ReplayFilter(
        ids=tuple(config.ids) if config.ids else None,
        topic=config.topic,
        tenant_id=config.tenant_id,
        error_code=config.error_code,
        since=_time(config.since, "since"),
        until=_time(config.until, "until"),
    )
    report = replay_dead(outbox_db.database_url(), table.name, selection, dry_run=config.dry_run, force=config.force,
                         actor=f"dagster:{context.run_id[:8]}")
    context.log.info(report.summary)
    if report.matched == 0:
        context.log.warning(f"{table.name}: no dead rows match {selection}; nothing to replay")
    yield dg.Output(None, metadata=metadata_values({
        "table": table.name, "dry_run": config.dry_run, "matched": report.matched, "replayed": report.replayed,
        "refused_bad_request": report.refused, "replayed_ids": report.replayed_ids[:1000],
        "refused_ids": report.refused_ids[:1000], "by_error_code": report.by_error_code or None,
        "summary": report.summary,
    }))


def replay_jobs() -> List[dg.JobDefinition]:
    @dg.job(description="Replay dead messages by filter. Dry run by default; BAD_REQUEST rows need force.",
            executor_def=dg.in_process_executor)
    def replay_dead_job():
        replay_dead_op()

    return [replay_dead_job]
