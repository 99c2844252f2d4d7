"""The inbox tables in the database: created by ``db upgrade`` for each declared inbox (migration 0022's
``outbox_create_inbox``), and listed (``db grant`` gives the roles their rights on them, the cleaner empties them)."""

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import InvalidTableName
from outbox_pipelines.core.inbox.receive import inbox_name
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.queries import shared_query
from outbox_pipelines.core.storage.schema import RELATION_KINDS
from outbox_pipelines.core.storage.table import SharedTables

# The columns that make an existing table an inbox.
INBOX_COLUMNS = frozenset({"consumer", "message_id", "received_at"})


def inbox_tables(conn: psycopg.Connection) -> list[str]:
    """The inbox tables of the current schema, by name."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("inbox_tables_list"))
        return [row["table_name"] for row in cur.fetchall()]


def list_inboxes(url: str) -> list[str]:
    with connect(url) as conn:
        return inbox_tables(conn)


def create_inbox(url: str, name: str) -> bool:
    """Create the inbox table ``name``; False if it already existed. A name that already names another relation
    (an outbox table, a business table, a view) is refused with InvalidTableName, nothing changed."""
    inbox_name(name)
    with connect(url) as conn:
        found = SharedTables(conn).find_relation(name)
        if found is not None and not (
            found["relkind"] == "r" and found["here"] and INBOX_COLUMNS <= set(found["columns"])
        ):
            kind = RELATION_KINDS.get(found["relkind"], "relation")
            raise InvalidTableName(
                f"{name!r} already names a {kind} in schema {found['nspname']} that is not an inbox table; nothing "
                "was changed. Choose another name for the inbox (e.g. 'billing_inbox')."
            )
        conn.execute(shared_query("inbox_create"), {"table_name": name})
    return found is None
