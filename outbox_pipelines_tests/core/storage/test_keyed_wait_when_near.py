"""Migration 0027 and its contract step on a database of the version before: a keyed message far behind its key's last
waits as before until `db upgrade --contract`, then is stored ready, as a new table stores it; neither step takes a
table lock while a writer's transaction is open."""

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines_tests.core.earlier_versions import insert_keyed, keyed_table_before, upgrade_beside_a_writer

TABLE = "keyed_outbox"
INSERT_KEYED = insert_keyed(TABLE)


@pytest.fixture
def migrated_from_0026(empty_db, tmp_path):
    """A database of the version before 0027 with a keyed table."""
    return keyed_table_before(empty_db, tmp_path, "0027", TABLE)


def _waiting_after_a_far_gap(conn: psycopg.Connection, table: str, tag: str) -> list[bool]:
    """Two messages of one key 2,000 ids apart, then one right behind the second: whether each waits."""
    conn.execute(insert_keyed(table), {"tag": f"{tag}a", "count": 1, "keys": 1})
    # a test's table names, not input
    conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}) + 2000)")
    conn.execute(insert_keyed(table), {"tag": f"{tag}b", "count": 2, "keys": 1})
    found = conn.execute(f"SELECT ordering_blocked FROM {table} WHERE event_id LIKE %s ORDER BY id", (f"{tag}%",))
    return [row["ordering_blocked"] for row in found]


def test_a_database_of_the_version_before_stores_a_far_message_ready_after_an_upgrade_beside_a_writer(
    migrated_from_0026,
):
    url = migrated_from_0026
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert _waiting_after_a_far_gap(conn, TABLE, "before-") == [False, True, True]  # every later one waited
        applied = upgrade_beside_a_writer(
            url, lambda holder: holder.execute(INSERT_KEYED, {"tag": "held", "count": 1, "keys": 1})
        )
        assert [name for name in applied if name.startswith("0027")] == ["0027_claims_mark_waiting.sql"]
        conn.execute(f"DELETE FROM {TABLE}")
        # a relay of the version before marks nothing: the far message waits from its insert until the contract step
        assert _waiting_after_a_far_gap(conn, TABLE, "expanded-") == [False, True, True]
        conn.execute(f"DELETE FROM {TABLE}")
        contracted = upgrade_beside_a_writer(
            url, lambda holder: holder.execute(INSERT_KEYED, {"tag": "held2", "count": 1, "keys": 1}), contract=True
        )
        assert "contract/0002_keyed_ready_when_far.sql" in contracted
        assert _waiting_after_a_far_gap(conn, TABLE, "after-") == [False, False, True]
        conn.execute("SELECT outbox_create_table('fresh_keyed')")
        assert _waiting_after_a_far_gap(conn, "fresh_keyed", "fresh-") == [False, False, True]
