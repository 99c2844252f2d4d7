"""Migration 0026: the check after a login's UPDATE or DELETE of outbox rows reads each statement's rows once (the
behaviour, and that the engine's own statements still add no audit row: test_row_history.py). A database of the
version before gets it while its writers write, without waiting for them."""

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.storage import migrate
from outbox_pipelines_tests.core.earlier_versions import upgrade_beside_a_writer, upgrade_to_before

TABLE = "linear_outbox"
INSERT = (
    f"INSERT INTO {TABLE} (event_id, topic, payload, payload_sha, headers) "
    "SELECT %(tag)s || '-' || n, 't', '{}'::jsonb, 'sha', '{}'::jsonb FROM generate_series(1, %(count)s) AS n"
)


def _check_body(conn: psycopg.Connection) -> str:
    return str(conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'outbox_record_changes'").fetchone()["prosrc"])


def test_a_database_of_the_version_before_gets_the_check_without_waiting_for_its_writers(empty_db, tmp_path):
    url = empty_db
    upgrade_to_before(url, tmp_path, "0026")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("SELECT outbox_create_table(%s)", (TABLE,))
        assert "row_changes" not in _check_body(conn)
        # A transaction writing into the table all along, and one updating its rows: neither is waited for.
        conn.execute(INSERT, {"tag": "before", "count": 10})
        applied = upgrade_beside_a_writer(
            url,
            lambda holder: (
                holder.execute(INSERT, {"tag": "held", "count": 1}),
                holder.execute(f"UPDATE {TABLE} SET attempts = attempts + 1 WHERE event_id = 'before-1'"),
            ),
        )
        assert [name for name in applied if name.startswith("0026")] == ["0026_untold_changes_linear.sql"]
        assert "row_changes" in _check_body(conn)
        assert migrate.upgrade(url) == []  # nothing left to apply
