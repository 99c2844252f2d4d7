"""The engine's SQL, one method a named statement: ``OutboxTable`` for one outbox table,
``SharedTables`` for the tables and clock every outbox table shares.

``OutboxTable`` is composed of one class per family of statements, each in a module of its own:

- ``table_enqueue``: insert one message, a batch in one statement, a batch by COPY;
- ``table_claims``: the relay's cycle (claim, settle, renew, release) and the reads between cycles;
- ``table_lock_and_audit``: the single-active lock and the audit rows about the table;
- ``table_maintenance``: requeue, skip dead heads, the ordering sweep, retention, replay, backfill pages;
- ``table_reads``: health and status figures (and ``ready_tables``, for many tables at once);

on ``statements.TableStatements``, which validates the name and runs a statement. ``SharedTables`` is
shared_tables.py's. These modules are the engine's only ones that name queries (sql/queries/*.sql). The
order wing's ledger keeps its own (ledger.sql), and the statements that run before the schema exists are
bootstrap.sql's, read by core/storage/embedded.py, core/storage/migrate.py and defs/dagster_home.py. ``now``
parameters exist for tests that move database time; production passes None and every statement uses the
server's ``now()``.
"""

from outbox_pipelines.core.storage.shared_tables import SharedTables
from outbox_pipelines.core.storage.statements import Row, Statement, unknown_table
from outbox_pipelines.core.storage.table_claims import PLAN_REUSE_MAX_ROWS, ClaimStatements, Settlement, bigint_array
from outbox_pipelines.core.storage.table_enqueue import EnqueueStatements, NewRow
from outbox_pipelines.core.storage.table_lock_and_audit import LockAndAuditStatements
from outbox_pipelines.core.storage.table_maintenance import MaintenanceStatements
from outbox_pipelines.core.storage.table_reads import StatusReads, ready_tables

__all__ = [
    "PLAN_REUSE_MAX_ROWS",
    "NewRow",
    "OutboxTable",
    "Row",
    "Settlement",
    "SharedTables",
    "Statement",
    "bigint_array",
    "ready_tables",
    "unknown_table",
]


class OutboxTable(EnqueueStatements, ClaimStatements, LockAndAuditStatements, MaintenanceStatements, StatusReads):
    """Enqueue into, claim, settle and maintain one outbox table through one psycopg connection:
    ``OutboxTable(conn, table_name)``, the name validated where it enters the engine."""
