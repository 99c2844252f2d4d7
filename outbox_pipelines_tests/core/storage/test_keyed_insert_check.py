"""Migration 0024: a keyed message's insert check probes its key's index whatever the table's statistics say. On a
queue that was analyzed full and is empty again (drained, cleaned, vacuumed), the version before scanned the whole
table once per keyed row, which a burst made quadratic; now no keyed insert scans the table, a database of the
version before gets the check without a table lock, and a message still waits behind an earlier one of its key."""

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core.storage import migrate
from outbox_pipelines_tests.core.earlier_versions import insert_keyed, keyed_table_before, upgrade_beside_a_writer

TABLE = "keyed_outbox"


@pytest.fixture
def migrated_from_0023(empty_db, tmp_path):
    """A database of the version before 0024 with a keyed table."""
    return keyed_table_before(empty_db, tmp_path, "0024", TABLE)


# Keyed rows as any writer inserts them (the check is the table's trigger, whoever writes): n, then its key.
INSERT_KEYED = insert_keyed(TABLE)


def _emptied_after_analyze(url: str, rows: int = 2000) -> None:
    """The queue as it is after a backlog was drained and cleaned: analyzed full, empty now, its file truncated."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(INSERT_KEYED, {"tag": "old", "count": rows, "keys": 400})
        conn.execute(f"ANALYZE {TABLE}")
        conn.execute(f"DELETE FROM {TABLE}")
        conn.execute(f"VACUUM {TABLE}")


def _burst_scans(url: str, tag: str, count: int = 500) -> dict:
    """Insert ``count`` keyed messages (100 keys) in one statement; the table's scans of that transaction."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        conn.execute(INSERT_KEYED, {"tag": tag, "count": count, "keys": 100})
        return conn.execute(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = %s", (TABLE,)
        ).fetchone()


def _check_config(conn, table: str) -> list[str]:
    return conn.execute(
        "SELECT coalesce(proconfig, '{}') AS config FROM pg_proc "
        "WHERE oid = to_regprocedure(quote_ident(outbox_ordering_function('waits', %s)) || '()')",
        (table,),
    ).fetchone()["config"]


def test_a_burst_into_an_emptied_queue_probes_the_index_instead_of_scanning_once_per_row(migrated_from_0023):
    url = migrated_from_0023
    _emptied_after_analyze(url)
    before = _burst_scans(url, "before")
    assert before["seq_scan"] >= 100  # the version before: a scan of the table for (nearly) every keyed row
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {TABLE}")
        conn.execute(f"VACUUM {TABLE}")
    migrate.upgrade(url)
    after = _burst_scans(url, "after")
    assert after["seq_scan"] == 0
    assert after["idx_scan"] >= 500
    with psycopg.connect(url, row_factory=dict_row) as conn:
        # Per-key order is kept: each key's first message is free, the four behind it wait.
        waiting = conn.execute(
            f"SELECT count(*) FILTER (WHERE ordering_blocked) AS blocked, count(*) AS n FROM {TABLE} "
            "WHERE event_id LIKE 'after-%%'"
        ).fetchone()
    assert (waiting["blocked"], waiting["n"]) == (400, 500)


def test_a_database_of_the_version_before_gets_the_check_a_new_table_gets_without_a_table_lock(migrated_from_0023):
    url = migrated_from_0023
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert "enable_seqscan=off" not in _check_config(conn, TABLE)
        # A transaction writing into the table all along: replacing its function waits for no lock of it.
        applied = upgrade_beside_a_writer(
            url, lambda holder: holder.execute(INSERT_KEYED, {"tag": "held", "count": 1, "keys": 1})
        )
        assert [name for name in applied if name.startswith("0024")] == ["0024_keyed_insert_check_by_index.sql"]
        conn.execute("SELECT outbox_create_table('fresh_keyed')")
        assert "enable_seqscan=off" in _check_config(conn, TABLE)
        assert _check_config(conn, TABLE) == _check_config(conn, "fresh_keyed")
        # The setting is the function's own: the session's is as it was.
        assert conn.execute("SHOW enable_seqscan").fetchone()["enable_seqscan"] == "on"
