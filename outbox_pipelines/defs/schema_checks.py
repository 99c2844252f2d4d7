"""The database schema as an asset with two checks: ``schema_version`` and ``schema_drift`` (core/storage/), each
one core function's sentences, as ``db status`` prints them.

An older schema fails ``schema_version`` (ERROR) and the code location still loads; drift is ERROR when something
fails, WARN when it is only slower. ``outbox_checks_job`` runs them with the tables' checks.
"""

import dagster as dg

from outbox_pipelines.core.operations.upgrade import declared_tables
from outbox_pipelines.core.storage.db import driver_connection
from outbox_pipelines.core.storage.schema_drift import ERROR, find_drift
from outbox_pipelines.core.storage.schema_version import schema_behind
from outbox_pipelines.defs.resources import OutboxDb

SCHEMA_ASSET_KEY = dg.AssetKey(["outbox_schema"])
SCHEMA_ASSET = dg.AssetSpec(
    key=SCHEMA_ASSET_KEY,
    description="The outbox's database schema: its migrations, indexes, functions and grants. Observed by its "
    "checks, never materialized.",
    group_name="outbox",
    kinds={"postgres"},
)


@dg.asset_check(
    asset=SCHEMA_ASSET_KEY,
    name="schema_version",
    description="the database has every migration this version of the code needs (else: outbox-pipelines db upgrade)",
)
def schema_version_check(outbox_db: OutboxDb) -> dg.AssetCheckResult:
    with outbox_db.engine().connect() as conn:
        behind = schema_behind(driver_connection(conn))
    return dg.AssetCheckResult(
        passed=behind is None,
        severity=dg.AssetCheckSeverity.ERROR,
        description=behind or "the database has every migration this version needs",
    )


@dg.asset_check(
    asset=SCHEMA_ASSET_KEY,
    name="schema_drift",
    description="the declared tables have their indexes (none INVALID), the outbox functions are those the "
    "migrations define, and the package's roles hold their grants",
)
def schema_drift_check(outbox_db: OutboxDb) -> dg.AssetCheckResult:
    settings = outbox_db.settings()
    with outbox_db.engine().connect() as conn:
        drift = find_drift(driver_connection(conn), sorted(declared_tables(settings)), settings.parts)
    return dg.AssetCheckResult(
        passed=not drift,
        severity=dg.AssetCheckSeverity.ERROR if any(d.severity == ERROR for d in drift) else dg.AssetCheckSeverity.WARN,
        description="\n".join(d.sentence for d in drift) or "no drift",
        metadata={"drift": len(drift)},
    )


def schema_checks() -> tuple[list[dg.AssetSpec], list[dg.AssetChecksDefinition]]:
    """The schema's asset and its two checks, for the definitions (defs/factory.py)."""
    return [SCHEMA_ASSET], [schema_version_check, schema_drift_check]
