"""Each outbox table is an observed asset with its checks: lag, dead letters, stuck, backlog, destination, relay,
blocked keys.

Where open-source Dagster 1.13's UI shows a table's health (drills/test_catalog_health.py checks it):
- Lineage: the table's "Asset checks" row, ✗ while an ERROR check fails, ⚠ while only WARN ones fail, else ✓ n/n.
- Catalog: no health column (it and GraphQL's ``assetHealth`` are Dagster+ only: null here). The Status column
  turns red while an ERROR check fails, else reads "–": the asset is external and never materialized.
- Checks tab: the checks sorted by name, opened on the first (backlog) unless the link names one
  (``?view=checks&checkDetail=dead_letters``); declaration order does not count.
The asset stays an external spec: an observable one would read "Observed <time>" in the Catalog and lose the red.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from outbox_pipelines.core.oncall.health import CHECK_NAMES
from outbox_pipelines.defs.common import MAINTENANCE_TAGS, metadata_values, table_asset_key
from outbox_pipelines.defs.resources import OutboxDb

SEVERITY = {"warn": dg.AssetCheckSeverity.WARN, "error": dg.AssetCheckSeverity.ERROR}
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
    return dg.AssetSpec(
        key=table_asset_key(table_name),
        description=f"The outbox table {table_name}: observed by relay runs and its checks, never materialized.",
        group_name="outbox",
        kinds={"postgres"},
        metadata={"table": table_name},
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
        for verdict in outbox_db.table_verdicts(table_name):
            if verdict.name not in selected:
                continue
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=verdict.name,
                passed=verdict.passed,
                severity=SEVERITY.get(verdict.severity, dg.AssetCheckSeverity.WARN),
                description=verdict.description,
                metadata=check_metadata(verdict.metadata),
            )

    return _checks


def assets_and_checks(
    table_names: list[str],
) -> tuple[list[dg.AssetSpec], list[dg.AssetChecksDefinition]]:
    return [table_asset(t) for t in table_names], [table_checks(t) for t in table_names]


CHECKS_JOB = dg.define_asset_job(
    name="outbox_checks_job",
    selection=dg.AssetSelection.all_asset_checks(),
    description="Run every outbox table's health checks.",
    executor_def=dg.in_process_executor,
    tags=MAINTENANCE_TAGS,
)
