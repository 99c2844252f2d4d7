"""The database side of each outbox table as an asset check: ``vacuum`` (core/oncall/database_health.py).

WARN or ERROR while a transaction, a prepared transaction or a replication slot holds vacuum back and the
table's dead tuples pile up (its sentence names the pid and the application, and how to end it), WARN while
autovacuum falls behind with nothing holding it back; OK with the table's dead tuples, live rows, and table
and index size. The on-call sensor records it with the other checks every 15 s and alerts once for the
database (one holder holds every table back); running the check here reads it now.
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
