"""Each outbox table is an asset with its checks: lag, dead letters, stuck, backlog, destination, relay,
blocked keys.

The asset stays an external spec, its state recorded by defs/table_health.py. Where Dagster's UI shows each
part: docs/explanation/front-ends.md, "Where the UI shows it".
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from outbox_pipelines.core.models import CheckSeverity
from outbox_pipelines.core.oncall.database_health import vacuum_verdicts
from outbox_pipelines.core.oncall.health import CHECK_NAMES
from outbox_pipelines.core.oncall.sweep import table_verdicts
from outbox_pipelines.core.storage.db import driver_connection
from outbox_pipelines.defs.common import MAINTENANCE_TAGS, metadata_values, table_asset_key
from outbox_pipelines.defs.links import oncall_page_url
from outbox_pipelines.defs.resources import OutboxDb
from outbox_pipelines.defs.table_health import health_materialization, message_rows_metadata

SEVERITY = {CheckSeverity.WARN: dg.AssetCheckSeverity.WARN, CheckSeverity.ERROR: dg.AssetCheckSeverity.ERROR}
CHECK_DESCRIPTIONS = {
    "lag": "how late what waits now is: the p95 and the oldest of the messages due and not yet delivered "
    "(pending and due, or in flight), each timed from when it became due (a retry when its backoff ends, a "
    "replay at the replay); nothing waiting passes. The last hour's created → delivered lag is shown, not "
    "graded",
    "dead_letters": "messages in dead, by error code (replay them with replay_dead_job, a dry run first)",
    "stuck": "messages in sending past their lease or the stuck threshold (requeue_stuck_job returns them)",
    "backlog": "messages waiting to be relayed",
    "destination": "how long the destination has failed every delivery (timeouts, 5xx, 401): an outage shows "
    "while it lasts",
    "relay": "whether the table can be relayed at all: its settings can be used, its relay group can build its "
    "destination (handlers import) and run its relay",
    "blocked_keys": 'ordering keys held back by a dead message (ordering = "park"): which, since when, how many '
    "messages wait behind (replay the dead message, or skip it with skip_dead_job)",
}


def check_metadata(values: dict[str, Any]) -> dict[str, Any]:
    """Measurements as numbers (the UI plots them); thresholds as text (a flat line is noise)."""
    measured = {
        k: v for k, v in values.items() if not k.endswith(("_warn", "_error", "_warn_s", "_error_s")) and v is not None
    }
    limits = {k: dg.MetadataValue.text(str(v)) for k, v in values.items() if k not in measured}
    return {**metadata_values(measured), **limits}


def table_asset(table_name: str) -> dg.AssetSpec:
    """The table's asset: its description says what a "materialization" of it is (the state its checks saw),
    and links the on-call page when one is served (OUTBOX_ONCALL_URL)."""
    page = oncall_page_url(table_name)
    description = (
        f"The outbox table {table_name}. Each materialization is the table's state as its checks saw it: health "
        "(healthy / warning / failing, by its worst check), messages per state, the oldest waiting; recorded "
        "when the checks' grades change and every few minutes. Nothing is built here: relay runs deliver."
    )
    if page:
        description += f" Its dead and blocked messages, to replay or skip: [on-call page]({page})."
    return dg.AssetSpec(
        key=table_asset_key(table_name),
        description=description,
        group_name="outbox",
        kinds={"postgres"},
        metadata={"table": table_name, **({"on-call page": dg.MetadataValue.url(page)} if page else {})},
    )


def table_checks(table_name: str) -> dg.AssetChecksDefinition:
    key = table_asset_key(table_name)

    @dg.multi_asset_check(
        name=f"{table_name}_health",
        specs=[dg.AssetCheckSpec(name=name, asset=key, description=CHECK_DESCRIPTIONS[name]) for name in CHECK_NAMES],
        description=f"Health of {table_name}",
        # Each check can run on its own, so the Checks tab can execute one, or all (no materialization needed).
        can_subset=True,
    )
    def _checks(context: dg.AssetCheckExecutionContext, outbox_db: OutboxDb) -> Iterator[dg.AssetCheckResult]:
        selected = {check.name for check in context.selected_asset_check_keys}
        settings = outbox_db.settings()
        with outbox_db.engine().connect() as pooled:
            conn = driver_connection(pooled)
            verdicts = table_verdicts(conn, settings, table_name)
            extra = message_rows_metadata(conn, table_name, [v for v in verdicts if v.name in selected])
            if selected >= set(CHECK_NAMES):  # all of them: the table's state first, which they are counted against
                vacuum = vacuum_verdicts(conn, settings, [table_name])[table_name]
                context.op_execution_context.log_event(health_materialization(table_name, [*verdicts, vacuum]))
        for verdict in verdicts:
            if verdict.name not in selected:
                continue
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=verdict.name,
                passed=verdict.passed,
                severity=SEVERITY.get(verdict.severity, dg.AssetCheckSeverity.WARN),
                description=verdict.description,
                metadata={**check_metadata(verdict.metadata), **extra.get(verdict.name, {})},
            )

    return _checks


def assets_and_checks(
    table_names: list[str],
) -> tuple[list[dg.AssetSpec], list[dg.AssetChecksDefinition]]:
    return [table_asset(t) for t in table_names], [table_checks(t) for t in table_names]


CHECKS_JOB_NAME = "outbox_checks_job"


def checks_job(asset_keys: list[dg.AssetKey]) -> UnresolvedAssetJobDefinition:
    """``outbox_checks_job``: the checks of the outbox's assets only (``asset_keys``), never those of the team's own
    assets that share the code location."""
    return dg.define_asset_job(
        name=CHECKS_JOB_NAME,
        selection=dg.AssetSelection.checks_for_assets(*asset_keys),
        description="Run every outbox table's health checks.",
        executor_def=dg.in_process_executor,
        tags=MAINTENANCE_TAGS,
    )
