"""Schema operations beyond migrations: creating more outbox tables."""

from outbox_pipelines.core.errors import InvalidTableName
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import Row, SharedTables

# Columns that make an existing table one of ours (created by an older version, say).
OUTBOX_COLUMNS = frozenset(
    {"id", "event_id", "topic", "payload", "payload_sha", "headers", "status", "attempts", "available_at"}
)
# pg_class.relkind as a person calls it.
RELATION_KINDS = {
    "r": "table",
    "v": "view",
    "m": "materialized view",
    "S": "sequence",
    "p": "partitioned table",
    "f": "foreign table",
    "i": "index",
}


def create_table(url: str, table_name: str, *, dedup_index: bool = False) -> bool:
    """Create an outbox table of the canonical shape; False if it already existed.

    A reserved name, or one that already names a relation that is not an outbox
    table (a business table, a view, a catalog such as pg_class), is refused with
    InvalidTableName before anything is changed.
    """
    validate_table_name(table_name)  # where the name comes in: before connecting
    with connect(url) as conn:
        shared = SharedTables(conn)
        found = shared.find_relation(table_name)
        if found is not None and not _is_outbox_table(found):
            kind = RELATION_KINDS.get(found["relkind"], "relation")
            raise InvalidTableName(
                f"{table_name!r} already names a {kind} in schema {found['nspname']} that is not an outbox table; "
                "nothing was changed. Choose another name (e.g. 'hrm_outbox')."
            )
        shared.create_outbox_table(table_name, dedup_index=dedup_index)
    return found is None


def _is_outbox_table(relation: Row) -> bool:
    """An ordinary table of the current schema with the outbox's columns (made by an older version, say)."""
    return bool(relation["relkind"] == "r" and relation["here"] and OUTBOX_COLUMNS <= set(relation["columns"]))


def list_tables(url: str) -> list[str]:
    with connect(url) as conn:
        return SharedTables(conn).outbox_table_names()
