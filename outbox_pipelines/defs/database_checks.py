"""The database side of each outbox table as an asset check: ``vacuum`` (core/oncall/database_health.py).

WARN or ERROR while something holds vacuum back and dead tuples pile up (the sentence names the pid and how to
end it), WARN while autovacuum falls behind; the on-call sensor alerts once for the database.
"""

import dagster as dg

from outbox_pipelines.core.oncall.database_health import CHECK, vacuum_verdicts
from outbox_pipelines.core.storage.db import driver_connection
from outbox_pipelines.defs.checks import SEVERITY, check_metadata
from outbox_pipelines.defs.common import table_asset_key
from outbox_pipelines.defs.resources import OutboxDb

DESCRIPTION = (
    "dead tuples against live rows, table and index size, and what holds vacuum back (an open transaction, a "
    "prepared transaction, a replication slot): WARN/ERROR while one has held it back past vacuum_held_warn / "
    "_error and the table holds dead_tuples_warn dead tuples, WARN while autovacuum falls behind"
)


def vacuum_check(table_name: str) -> dg.AssetChecksDefinition:
    key = table_asset_key(table_name)

    @dg.asset_check(asset=key, name=CHECK, description=DESCRIPTION)
    def _check(outbox_db: OutboxDb) -> dg.AssetCheckResult:
        with outbox_db.engine().connect() as conn:
            verdict = vacuum_verdicts(driver_connection(conn), outbox_db.settings(), [table_name])[table_name]
        return dg.AssetCheckResult(
            asset_key=key,
            check_name=CHECK,
            passed=verdict.passed,
            severity=SEVERITY.get(verdict.severity, dg.AssetCheckSeverity.WARN),
            description=verdict.description,
            metadata=check_metadata(verdict.metadata),
        )

    return _check


def database_checks(table_names: list[str]) -> list[dg.AssetChecksDefinition]:
    """The ``vacuum`` check of each outbox table's asset."""
    return [vacuum_check(name) for name in table_names]
