"""skip_dead_job: pass over dead messages that block their ordering keys (dry run by default).

A launch naming no message, a table that does not exist or an id that is not one is refused naming the
field (``RefusedLaunch``, defs/common.py), before the database is touched.
"""

from collections.abc import Iterator, Sequence

import dagster as dg
from pydantic import Field, field_validator

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.operations.replay import check_row_id
from outbox_pipelines.core.relay.ordering import skip_dead_heads
from outbox_pipelines.defs.common import (
    LaunchConfig,
    RefusedLaunch,
    audited_reason,
    launch_schema,
    metadata_values,
    resolve_table,
)
from outbox_pipelines.defs.replay import DRY_RUN_TAG
from outbox_pipelines.defs.resources import OutboxDb


class SkipConfig(LaunchConfig):
    """Which parked dead messages to pass over: their ids, or every one of an ordering key."""

    table: str = Field(description="Outbox table whose parked dead messages to pass over.")
    # ids or ordering_key names the messages; both start empty, written out in the launchpad: fill one.
    ids: list[int] | None = Field(
        default=[],
        description=(
            "The dead messages' row ids, as the blocked_keys check and 'outbox-pipelines status' name them, "
            "e.g. [101]; set these or ordering_key."
        ),
    )
    ordering_key: str | None = Field(
        default="", description="Every parked dead message of this ordering key; set this or ids ('' = none)."
    )
    reason: str = Field(default="skipped by an operator", description="Why: kept in the audit row (outbox_skip).")
    dry_run: bool = Field(
        default=True, description=("true (the default): only list what would be passed over. Set false to do it.")
    )

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        return audited_reason(value)

    @field_validator("ids")
    @classmethod
    def _row_ids(cls, value: list[int] | None) -> list[int] | None:
        # The same bound as replay's (a bigint): a larger number is a typo, not an id PostgreSQL can compare.
        return [check_row_id(row_id, "ids") for row_id in value] if value else value


def run_skip(context: dg.OpExecutionContext, config: SkipConfig, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
    """The body of skip_dead_op: the messages passed over (or listed), what moved in metadata."""
    table = resolve_table(outbox_db.settings(), config.table)
    context.instance.add_run_tags(context.run_id, {DRY_RUN_TAG: "true" if config.dry_run else "false"})
    try:
        report = skip_dead_heads(
            outbox_db.database_url(),
            table,
            ids=config.ids or None,
            ordering_key=config.ordering_key or None,
            dry_run=config.dry_run,
            worker=f"dagster:{context.run_id[:8]}",
            reason=config.reason,
        )
    except ConfigError as exc:
        # The core's "name the messages" rule raises a plain ConfigError; its subclasses (a database URL that
        # cannot be parsed) are the deployment's, and stay real failures.
        if type(exc) is not ConfigError:
            raise
        raise RefusedLaunch("ids", str(exc), table=table.name) from None
    context.log.info(report.summary)
    yield dg.Output(
        None,
        metadata=metadata_values(
            {
                "table": table.name,
                "dry_run": config.dry_run,
                "matched": len(report.matched),
                "skipped": report.skipped,
                "keys": ", ".join(report.keys) or None,
                "ids": [row_id for row_id, _, _ in report.matched][:1000],
                "summary": report.summary,
            }
        ),
    )


def skip_jobs(tables: Sequence[str] = ()) -> list[dg.JobDefinition]:
    """skip_dead_job, its table one of ``tables`` (the code location's)."""

    @dg.op(
        description=(
            "Pass over parked dead messages: they stay dead (replayable, audited as outbox_skip) and the later "
            "messages of their keys go on in order without them."
        ),
        config_schema=launch_schema(SkipConfig, tables),
        out=dg.Out(dg.Nothing),
    )
    def skip_dead_op(context: dg.OpExecutionContext, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
        yield from run_skip(context, SkipConfig(**context.op_config), outbox_db)

    @dg.job(
        description=(
            "Pass over dead messages that block their ordering keys (by ids or ordering_key), so the rest of each key "
            "goes on. Dry run by default. To keep the key's order instead, fix the cause and replay the message "
            "(replay_dead_job)."
        ),
        executor_def=dg.in_process_executor,
    )
    def skip_dead_job() -> None:
        skip_dead_op()

    return [skip_dead_job]
