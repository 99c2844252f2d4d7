"""Migrations that keep the application writing: the rules a new migration is held to, and the steps that run
outside a transaction (concurrent index builds), including the rebuild of an index an interrupted build left
INVALID."""

import shutil

import psycopg
import pytest

from outbox_pipelines.core.storage import migrate
from outbox_pipelines.core.storage.online_steps import NO_TRANSACTION, blocking_statements, parsed
from outbox_pipelines.core.storage.queries import sql_dir
from outbox_pipelines_tests.conftest import run_cli

# The first migration of each kind held to the rules; those before were shipped before the rules existed.
FIRST_CHECKED = {"migrations": "0014", "parts/orders": "0002", "parts/examples": "0002"}


@pytest.mark.parametrize(
    "text, said",
    [
        ("CREATE INDEX t_by_x ON t (x);", "CREATE INDEX without CONCURRENTLY"),
        ("CREATE UNIQUE INDEX t_by_x ON t (x);", "CREATE INDEX without CONCURRENTLY"),
        ("DROP INDEX t_by_x;", "DROP INDEX / REINDEX without CONCURRENTLY"),
        ("ALTER TABLE t ADD CONSTRAINT t_x CHECK (x > 0);", "checks every row under its lock"),
        ("ALTER TABLE t ALTER COLUMN x TYPE bigint;", "rewrites the table"),
        ("ALTER TABLE t ALTER COLUMN x SET NOT NULL;", "SET NOT NULL scans every row"),
        ("LOCK TABLE t IN ACCESS EXCLUSIVE MODE;", "hold an exclusive lock"),
        ("CREATE INDEX CONCURRENTLY IF NOT EXISTS t_by_x ON t (x);", "cannot run in a transaction"),
        # A DO block runs now: what it executes is the migration's.
        ("DO $$ BEGIN EXECUTE 'CREATE INDEX t_by_x ON t (x)'; END $$;", "CREATE INDEX without CONCURRENTLY"),
    ],
)
def test_a_statement_that_would_hold_the_writes_is_named_with_what_to_write_instead(text, said):
    found = blocking_statements(text)
    assert any(said in line and "write" in line for line in found), found


@pytest.mark.parametrize(
    "text",
    [
        f"{NO_TRANSACTION}\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_by_x ON t (x);\n",
        "ALTER TABLE t ADD COLUMN IF NOT EXISTS y text;\n",
        "ALTER TABLE t ADD CONSTRAINT t_x CHECK (x > 0) NOT VALID;\nALTER TABLE t VALIDATE CONSTRAINT t_x;\n",
        "-- CREATE INDEX t_by_x ON t (x) in a comment is no statement\nSELECT 1;\n",
        # A function's body runs where the function is called (a new table's indexes, made with the table).
        "CREATE OR REPLACE FUNCTION f(t text) RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n"
        "    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (x)', t || '_by_x', t);\nEND\n$$;\n",
    ],
)
def test_online_statements_pass(text):
    assert blocking_statements(text) == []


def test_every_migration_added_since_the_rules_keeps_the_application_writing():
    offenders = []
    for folder, first in FIRST_CHECKED.items():
        for migration in migrate.discover(sql_dir() / folder):
            if migration.version.split("/")[-1] >= first:
                offenders += [f"{folder}/{migration.name}: {why}" for why in blocking_statements(migration.sql)]
    assert not offenders, "\n".join(offenders)


def test_a_concurrent_build_runs_outside_a_transaction_and_rebuilds_an_index_left_invalid(db_url, conn, tmp_path):
    # What an interrupted concurrent build leaves: an INVALID index of the name (here a unique build that failed).
    conn.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('a', 't', '{}', 's')")
    conn.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('b', 't', '{}', 's')")
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("CREATE UNIQUE INDEX CONCURRENTLY drill_by_topic ON outbox_events (topic)")
    assert _valid(conn, "drill_by_topic") is False
    conn.execute("DELETE FROM outbox_events WHERE event_id = 'b'")

    migrations = tmp_path / "migrations"
    shutil.copytree(sql_dir() / "migrations", migrations)
    (migrations / "0099_drill_index.sql").write_text(
        f"{NO_TRANSACTION}\n-- a unique index on topic, built without stopping writes\n"
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS drill_by_topic ON outbox_events (topic);\n"
    )
    assert migrate.upgrade(db_url, migrations) == ["0099_drill_index.sql"]
    assert _valid(conn, "drill_by_topic") is True
    last = migrate.discover(migrations)[-1:]
    script = migrate.as_sql_script(last, 1.0, migrate.concrete_steps(db_url, last))
    assert "(outside a transaction: each statement on its own)" in script and "BEGIN;" not in script


def _valid(conn: psycopg.Connection, index: str) -> bool | None:
    row = conn.execute(
        "SELECT i.indisvalid AS valid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
        "WHERE c.relname = %s",
        (index,),
    ).fetchone()
    return None if row is None else bool(row["valid"])


def test_db_status_names_an_index_an_interrupted_build_left_invalid(cli_env, conn):
    clean = run_cli(cli_env, "db", "status")
    assert clean.returncode == 0 and "pending: none" in clean.stdout and "drift" not in clean.stdout, clean.stdout
    conn.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('a', 't', '{}', 's')")
    conn.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('b', 't', '{}', 's')")
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("CREATE UNIQUE INDEX CONCURRENTLY drill_by_topic ON outbox_events (topic)")
    drifted = run_cli(cli_env, "db", "status")
    assert drifted.returncode == 1
    assert "drift: index drill_by_topic on outbox_events is INVALID" in drifted.stdout
    assert "REINDEX INDEX CONCURRENTLY drill_by_topic" in drifted.stdout


def test_a_function_body_and_a_generating_query_are_each_one_statement():
    text = (
        f"{NO_TRANSACTION}\n"
        "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN\n    RETURN 1;\nEND\n$$;\n"
        "-- outbox: run each statement this query returns\n"
        "SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %I', 'x');\n"
        "SELECT 2;\n"
    )
    found = parsed(text)
    assert [s.generates for s in found] == [False, True, False]
    assert found[0].text.endswith("END\n$$;") and "RETURN 1;" in found[0].text


def test_a_generating_query_runs_one_step_per_row_it_returns(db_url, conn, tmp_path):
    """One concurrent build per outbox table the database has, whatever they are; each shown by --dry-run."""
    conn.execute("SELECT outbox_create_table('billing_outbox')")
    migrations = tmp_path / "migrations"
    shutil.copytree(sql_dir() / "migrations", migrations)
    (migrations / "0099_per_table.sql").write_text(
        f"{NO_TRANSACTION}\n-- outbox: run each statement this query returns\n"
        "SELECT format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (topic)', table_name || '_by_topic',\n"
        "              table_name)\n"
        "FROM (SELECT c.relname::text AS table_name FROM pg_class AS c JOIN pg_trigger AS t ON t.tgrelid = c.oid\n"
        "      WHERE t.tgname = 'outbox_notify_insert') AS outbox_table ORDER BY 1;\n"
    )
    last = migrate.discover(migrations)[-1:]
    steps = migrate.concrete_steps(db_url, last)["0099"]
    assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS billing_outbox_by_topic ON billing_outbox (topic);" in steps
    assert len(steps) == len(conn.execute("SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_notify_insert'").fetchall())
    assert migrate.upgrade(db_url, migrations) == ["0099_per_table.sql"]
    assert _valid(conn, "billing_outbox_by_topic") is True
    assert _valid(conn, "outbox_events_by_topic") is True
