"""Schema operations beyond migrations: creating more outbox tables."""

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.queries import shared_query


def create_table(url: str, table: str, *, dedup_index: bool = False) -> bool:
    """Create an outbox table of the canonical shape; False if it already existed."""
    validate_table_name(table)
    with connect(url) as conn:
        existed = conn.execute("SELECT to_regclass(%s) IS NOT NULL AS ok", (f'"{table}"',)).fetchone()["ok"]
        conn.execute("SELECT outbox_create_table(%s, %s)", (table, dedup_index))
    return not existed


def list_tables(url: str) -> list[str]:
    with connect(url) as conn:
        return [row["table_name"] for row in conn.execute(shared_query("outbox_tables_list"))]
