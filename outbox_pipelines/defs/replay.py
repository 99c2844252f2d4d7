"""replay_dead_job: move dead messages back to pending by filter (dry run by default).

The checks are the core's (core/operations/replay.py), the same ones the CLI's ``replay`` runs; a launch that fails them
is refused naming the field (``RefusedLaunch``, defs/common.py), before the database is touched when the
check needs no data (no filter, a time, an id), after a read when it does (an unknown error code).
"""

from collections.abc import Iterator, Sequence

import dagster as dg
from pydantic import Field, ValidationInfo, field_validator

from outbox_pipelines.core.operations.replay import (
    LIST_LIMIT,
    NEEDS_A_FILTER,
    ReplayFilter,
    ReplayRefused,
    check_filter,
    check_row_id,
    parse_death_time,
    replay_dead,
)
from outbox_pipelines.defs.common import (
    LaunchConfig,
    RefusedLaunch,
    audited_reason,
    launch_schema,
    metadata_values,
    resolve_table,
)
from outbox_pipelines.defs.resources import OutboxDb

DRY_RUN_TAG = "outbox/dry_run"

_TIME_HELP = (
    "the time of death (the row's updated_at when it went dead). Write it as ISO 8601 like "
    "2026-11-21T10:00:00Z (no offset means UTC), a date like 2026-11-21 (midnight UTC), or a time ago "
    "like 30m, 2h, 7d (from the database's clock)."
)


class ReplayConfig(LaunchConfig):
    """Which dead rows to move back to pending: the filters below, or all: true (the rule: see ``all``)."""

    table: str = Field(default="", description="Outbox table whose dead rows to replay.")
    # Every filter has a neutral default (empty: not filtering), so the launchpad opens with each one written out.
    ids: list[int] | None = Field(
        default=[], description="Filter: only these row ids (the outbox table's id column), e.g. [101, 102]; [] = any."
    )
    topic: str | None = Field(
        default="", description="Filter: only rows of this topic (exact match), e.g. order.created; '' = any."
    )
    tenant_id: str | None = Field(
        default="", description="Filter: only rows of this tenant id (exact match); '' = any."
    )
    error_code: str | None = Field(
        default="",
        description=(
            "Filter: only rows that died with this error code, case-insensitive, e.g. BROKER_5XX, NETWORK_TIMEOUT, "
            "UNAUTHORIZED, BAD_REQUEST (UNKNOWN = no code); '' = any. An unknown code is refused with the list of "
            "known ones."
        ),
    )
    since: str | None = Field(default="", description="Filter: died at or after this time ('' = any): " + _TIME_HELP)
    until: str | None = Field(default="", description="Filter: died before this time ('' = any): " + _TIME_HELP)
    all: bool = Field(
        default=False,
        description=(f"Set true to replay every dead row of the table. The rule, the CLI's too: {NEEDS_A_FILTER}"),
    )
    dry_run: bool = Field(
        default=True,
        description=(
            "true (the default): only list what would be replayed, change nothing. Set false to replay. "
            "The run is tagged outbox/dry_run=true or false."
        ),
    )
    force: bool = Field(
        default=False,
        description=(
            "Also replay rows that died of BAD_REQUEST (invalid input: they will likely fail the same way). "
            "Without it they are listed as refused."
        ),
    )
    reason: str = Field(
        default="",
        description=(
            "Why ('' = not said): kept in each replayed row's audit row (outbox_replay), before the error it "
            "died of. One printable line, as skip's and backfill's reason."
        ),
    )

    @field_validator("since", "until")
    @classmethod
    def _death_time(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value:
            try:
                # A field validator always knows its field; "time" only satisfies the type.
                parse_death_time(value, info.field_name or "time")
            except ReplayRefused as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        return audited_reason(value)

    @field_validator("ids")
    @classmethod
    def _row_ids(cls, value: list[int] | None) -> list[int] | None:
        for row_id in value or ():
            try:
                check_row_id(row_id, "ids")
            except ReplayRefused as exc:
                raise ValueError(str(exc)) from None
        return value


def _refuse(exc: ReplayRefused, config: ReplayConfig) -> RefusedLaunch:
    # Every refusal of the core names its input; "filter" only covers one that some day would not.
    return RefusedLaunch(exc.field or "filter", str(exc), table=config.table)


def selection_from_config(config: ReplayConfig) -> ReplayFilter:
    """The filter of the config, checked by the core before any database access (a refused launch when wrong).

    The config's validators ran already; they run again here because a config built without validation
    (``model_construct``) must not reach the database either.
    """
    try:
        selection = ReplayFilter(
            ids=tuple(check_row_id(i, "ids") for i in config.ids) if config.ids else None,
            topic=config.topic or None,
            tenant_id=config.tenant_id or None,
            error_code=config.error_code or None,
            since=parse_death_time(config.since, "since") if config.since else None,
            until=parse_death_time(config.until, "until") if config.until else None,
        )
        check_filter(selection, allow_all=config.all)  # the core's rule, the CLI's too
    except ReplayRefused as exc:
        raise _refuse(exc, config) from None
    return selection


def run_replay(context: dg.OpExecutionContext, config: ReplayConfig, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
    """The body of replay_dead_op: the filter checked, the rows replayed (or listed), their table in metadata."""
    selection = selection_from_config(config)  # before anything touches the database
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    context.instance.add_run_tags(context.run_id, {DRY_RUN_TAG: "true" if config.dry_run else "false"})
    try:
        report = replay_dead(
            outbox_db.database_url(),
            table.name,
            selection,
            dry_run=config.dry_run,
            force=config.force,
            allow_all=config.all,
            actor=f"dagster:{context.run_id[:8]}",
            reason=config.reason,
        )
    except ReplayRefused as exc:
        raise _refuse(exc, config) from None
    context.log.info(f"filter: {report.filter}")
    context.log.info(report.summary)
    if report.matched == 0:
        context.log.warning(f"{table.name}: no dead rows match {report.filter}; nothing to replay")
    metadata = metadata_values(
        {
            "table": table.name,
            "dry_run": config.dry_run,
            "filter": report.filter,
            "matched": report.matched,
            "would_replay": report.would_replay,
            "replayed": report.replayed,
            "refused_bad_request": report.refused,
            "replayed_ids": report.replayed_ids[:1000],
            "refused_ids": report.refused_ids[:1000],
            "by_error_code": report.by_error_code or None,
            "summary": report.summary,
        }
    )
    verb, count = ("Would replay", report.would_replay) if config.dry_run else ("Replayed", report.replayed)
    metadata["rows"] = dg.MetadataValue.md(
        f"**{verb} {count}** dead rows of `{table.name}` (filter: {report.filter})\n\n{report.rows_markdown()}"
    )
    if report.refused:
        metadata["refused_rows"] = dg.MetadataValue.md(
            f"**Refused {report.refused}** BAD_REQUEST rows (set force: true to replay them)\n\n"
            f"{report.refused_markdown()}"
        )
    yield dg.Output(None, metadata=metadata)


def replay_jobs(tables: Sequence[str] = ()) -> list[dg.JobDefinition]:
    """replay_dead_job, its table one of ``tables`` (the code location's)."""

    @dg.op(
        description=(
            "Replay dead messages matching the filters (or every one with all: true); lists the rows that were "
            f"(or in a dry run would be) replayed, the first {LIST_LIMIT} as a table, and counts them all."
        ),
        config_schema=launch_schema(ReplayConfig, tables),
        out=dg.Out(dg.Nothing),
    )
    def replay_dead_op(context: dg.OpExecutionContext, outbox_db: OutboxDb) -> Iterator[dg.Output[None]]:
        yield from run_replay(context, ReplayConfig(**context.op_config), outbox_db)

    @dg.job(
        description=(
            "Replay dead messages by filter (ids, topic, tenant, error code, died since/until) or all: true. "
            "Dry run by default: look at the op's 'rows' metadata, then run again with dry_run: false. "
            "BAD_REQUEST rows need force."
        ),
        executor_def=dg.in_process_executor,
    )
    def replay_dead_job() -> None:
        replay_dead_op()

    return [replay_dead_job]
