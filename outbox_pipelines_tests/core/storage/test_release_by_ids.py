"""Migration 0025: a key's release finds each released key's next message, then writes it by its id. Its plan, kept
for the relay's session, was made when the table was small (the relay's first keyed batches): the version before then
read every blocked row of the table, and each released key's next message for each, at every settle beside a keyed
backlog. A database of the version before gets the new release without a table lock, and the order holds."""

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core import models as m
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage import migrate
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.core.earlier_versions import insert_keyed, keyed_table_before, upgrade_beside_a_writer

TABLE = "keyed_outbox"


@pytest.fixture
def migrated_from_0024(empty_db, tmp_path):
    """A database of the version before 0025 with a keyed table."""
    return keyed_table_before(empty_db, tmp_path, "0025", TABLE)


# Keyed rows as any writer inserts them (this version's enqueue refuses the database before db upgrade).
INSERT_KEYED = insert_keyed(TABLE)


def _settle(table: OutboxTable, relay_conn: psycopg.Connection) -> int:
    """Claim a held batch and settle it sent: the rows the settle (and the release it calls) read."""
    with relay_conn.transaction():
        claimed = table.claim_held(100, 60, gated=True, reuse_plan=True)
        assert claimed
        before = _fetched(relay_conn)
        table.settle_sent(
            "w", [c.id for c in claimed], [c.attempts for c in claimed], audit_code=m.AUDIT_SUCCESS, held=True
        )
        return _fetched(relay_conn) - before


def _fetched(conn: psycopg.Connection) -> int:
    # pg_stat_xact_user_tables also counts what the session read and has not reported yet: callers take differences
    row = conn.execute("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = %s", (TABLE,)).fetchone()
    return int(row["idx_tup_fetch"])


def _settles_beside_a_keyed_backlog(url: str, prefix: str) -> list[int]:
    """A relay session whose first keyed batch settles while the table is small, then a backlog of 5,000 keyed
    messages over 100 keys arrives: the rows each of its next two settles reads."""
    with psycopg.connect(url, autocommit=True) as conn, open_session(url) as relay_conn:
        conn.execute(INSERT_KEYED, {"tag": f"{prefix}first", "count": 20, "keys": 10})
        table = OutboxTable(relay_conn, TABLE)
        _settle(table, relay_conn)  # the release's plan is made now, and kept for the session
        conn.execute(INSERT_KEYED, {"tag": f"{prefix}burst", "count": 5000, "keys": 100})
        return [_settle(table, relay_conn) for _ in range(2)]


def _heads_free(url: str) -> dict:
    """Per key of the pending rows: how many are free to claim (their key's head) and how many pending."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute(
            f"SELECT count(*) FILTER (WHERE NOT ordering_blocked) AS free, count(DISTINCT ordering_key) AS keys "
            f"FROM {TABLE} WHERE status = 'pending'"
        ).fetchone()


def test_a_settle_beside_a_keyed_backlog_reads_its_keys_not_the_backlog(migrated_from_0024):
    url = migrated_from_0024
    before = _settles_beside_a_keyed_backlog(url, "before-")
    assert max(before) >= 100_000, before  # the version before: every blocked row, times the keys released
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {TABLE}")
    migrate.upgrade(url)
    after = _settles_beside_a_keyed_backlog(url, "after-")
    assert max(after) < 2_000, after
    # Per-key order is kept: of each key's pending messages, exactly the first is free.
    heads = _heads_free(url)
    assert heads["free"] == heads["keys"] == 100


def test_a_database_of_the_version_before_gets_the_release_a_new_table_gets_without_a_table_lock(migrated_from_0024):
    url = migrated_from_0024

    def release_body(conn, table: str) -> str:
        return conn.execute(
            "SELECT replace(prosrc, %s, 'T') AS body FROM pg_proc "
            "WHERE proname = outbox_ordering_function('release', %s)",
            (table, table),
        ).fetchone()["body"]

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert "ANY(ARRAY(" not in release_body(conn, TABLE)
        # A transaction writing into the table all along: replacing its function waits for no lock of it.
        applied = upgrade_beside_a_writer(
            url,
            lambda holder: holder.execute(INSERT_KEYED, {"tag": "held", "count": 1, "keys": 1}),
        )
        assert [name for name in applied if name.startswith("0025")] == ["0025_release_by_ids.sql"]
        conn.execute("SELECT outbox_create_table('fresh_keyed')")
        assert "ANY(ARRAY(" in release_body(conn, TABLE)
        assert release_body(conn, TABLE) == release_body(conn, "fresh_keyed")
