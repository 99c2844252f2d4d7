"""Schema operations beyond migrations: creating more outbox tables."""

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.errors import InvalidTableName
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.queries import shared_query

# Columns that make an existing table one of ours (created by an older version, say).
OUTBOX_COLUMNS = frozenset({"id", "event_id", "topic", "payload", "payload_sha", "headers", "status", "attempts",
                            "available_at"})


def create_table(url: str, table: str, *, dedup_index: bool = False) -> bool:
    """Create an outbox table of the canonical shape; False if it already existed.

    A reserved name, or one that already names a relation that is not an outbox
    table (a business table, a view, a catalog such as pg_class), is refused with
    InvalidTableName before anything is changed.
    """
    validate_table_name(table)
    with connect(url) as conn:
        found = conn.execute(
            """
            SELECT c.oid, c.relkind, n.nspname, n.nspname = current_schema() AS here,
                   ARRAY(SELECT a.attname::text FROM pg_attribute AS a
                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) AS columns
            FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
            WHERE c.oid = to_regclass(%s)
            """,
            (f'"{table}"',),
        ).fetchone()
        if found is not None:
            kind = {"r": "table", "v": "view", "m": "materialized view", "S": "sequence", "p": "partitioned table",
                    "f": "foreign table", "i": "index"}.get(found["relkind"], "relation")
            if not (found["relkind"] == "r" and found["here"] and OUTBOX_COLUMNS <= set(found["columns"])):
                raise InvalidTableName(
                    f"{table!r} already names a {kind} in schema {found['nspname']} that is not an outbox table; "
                    "nothing was changed. Choose another name (e.g. 'hrm_outbox')."
                )
        conn.execute("SELECT outbox_create_table(%s, %s)", (table, dedup_index))
    return found is None


def list_tables(url: str) -> list[str]:
    with connect(url) as conn:
        return [row["table_name"] for row in conn.execute(shared_query("outbox_tables_list"))]
