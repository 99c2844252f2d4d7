"""The engine's SQL, one method a named statement: ``OutboxTable`` for one outbox table,
``SharedTables`` for the tables and clock every outbox table shares.

``OutboxTable`` is composed of one class per family of statements (``table_*`` modules); these are the engine's
only modules naming queries of sql/queries. ``now`` parameters are for tests; production passes None.
The families: docs/explanation/codebase.md, "The storage room".
"""

from outbox_pipelines.core.storage.array_literals import bigint_array
from outbox_pipelines.core.storage.settlements import Settlement
from outbox_pipelines.core.storage.shared_tables import SharedTables
from outbox_pipelines.core.storage.statements import Row, Statement, unknown_table
from outbox_pipelines.core.storage.table_claims import ClaimStatements
from outbox_pipelines.core.storage.table_enqueue import EnqueueStatements, NewRow
from outbox_pipelines.core.storage.table_lock_and_audit import LockAndAuditStatements
from outbox_pipelines.core.storage.table_maintenance import MaintenanceStatements
from outbox_pipelines.core.storage.table_reads import StatusReads, ready_tables

__all__ = [
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
