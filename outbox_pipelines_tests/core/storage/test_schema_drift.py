"""Drift between a migrated database and what its migrations define, as ``db status`` prints it (exit 1) and the
code location's ``schema_drift`` check fails on it (defs/test_schema_checks.py): each sentence says what, what it
breaks and what to do, and doing what it says clears it."""

from collections.abc import Iterator

import psycopg
import pytest

from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage import migrate, roles, schema
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.schema_definitions import defined_functions, table_indexes
from outbox_pipelines.core.storage.schema_drift import Drift, find_drift
from outbox_pipelines_tests.conftest import run_cli

TABLE = "outbox_events"


@pytest.fixture
def declared() -> list[str]:
    """The outbox tables this repository's project declares (outbox.toml), as db status reads them."""
    return sorted(load_settings().tables)


def drift_of(db_url: str, tables: list[str]) -> list[Drift]:
    with connect(db_url) as conn:
        return find_drift(conn, tables, load_settings().parts)


def sentences(db_url: str, tables: list[str]) -> list[str]:
    return [d.sentence for d in drift_of(db_url, tables)]


def test_a_migrated_database_has_no_drift(db_url, declared):
    assert declared and drift_of(db_url, declared) == []


def test_the_indexes_expected_are_those_outbox_create_table_makes(conn):
    """The set is read from the function's text: every index a new table gets is expected, and nothing else."""
    conn.execute("SELECT outbox_create_table('drift_probe')")
    made = {
        row["indexname"].removeprefix("drift_probe_")
        for row in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'drift_probe'")
    }
    expected = {d.suffix for d in table_indexes(defined_functions(migrate.discover())) if not d.optional}
    assert expected == made - {"pkey"}


def test_a_missing_index_is_named_with_the_statement_that_builds_it_concurrently(db_url, conn, declared):
    conn.execute(f"DROP INDEX {TABLE}_ready_by_id")
    [found] = drift_of(db_url, declared)
    assert (found.kind, found.subject, found.severity) == ("index", f"{TABLE}_ready_by_id", "warn")
    assert f"index {TABLE}_ready_by_id of outbox table {TABLE} is missing" in found.sentence
    statement = found.sentence.split("Build it without stopping writes: ")[1]
    assert statement.startswith("CREATE INDEX CONCURRENTLY IF NOT EXISTS")
    conn.execute(statement)  # what it says to do, as said
    assert drift_of(db_url, declared) == []
    # The unique constraint's index too: built concurrently, then attached as the constraint.
    conn.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {TABLE}_event_id_key")
    [unique] = drift_of(db_url, declared)
    for step in unique.sentence.split("Build it without stopping writes: ")[1].split("; "):
        conn.execute(step)
    assert drift_of(db_url, declared) == []


def test_a_declared_table_that_does_not_exist_says_to_upgrade(db_url, declared):
    [found] = drift_of(db_url, [*declared, "billing_outbox"])
    assert found.kind == "table" and found.severity == "error"
    assert "billing_outbox is declared but does not exist" in found.sentence and "db upgrade" in found.sentence


def _definition_of(name: str) -> str:
    """The CREATE FUNCTION statement of ``name`` in the migration that defines it last."""
    from outbox_pipelines.core.storage.schema_definitions import top_level_statements

    for migration in reversed(migrate.discover()):
        for statement in top_level_statements(migration.sql):
            if f"FUNCTION {name}(" in statement:
                return statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    raise AssertionError(name)


def test_a_function_changed_or_dropped_by_hand_is_named_with_its_migration(db_url, conn, declared):
    conn.execute(
        "CREATE OR REPLACE FUNCTION outbox_ordering_stripe(ordering_key text) RETURNS integer "
        "LANGUAGE sql IMMUTABLE AS $$ SELECT 0 $$"
    )
    [changed] = drift_of(db_url, declared)
    assert (changed.kind, changed.subject, changed.severity) == ("function", "outbox_ordering_stripe", "error")
    assert "function outbox_ordering_stripe differs from the one 0010_ordering.sql defines" in changed.sentence
    conn.execute(_definition_of("outbox_ordering_stripe"))  # restored as the sentence says
    assert drift_of(db_url, declared) == []
    conn.execute("DROP FUNCTION outbox_lease_lost_detail")
    [dropped] = drift_of(db_url, declared)
    assert "function outbox_lease_lost_detail is missing" in dropped.sentence
    assert "0008_lease_lost_detail.sql" in dropped.sentence


def test_a_function_of_a_migration_applied_with_an_earlier_text_is_not_compared(db_url, conn, declared):
    """What an earlier text of the file defined is not on disk: no drift claimed either way."""
    conn.execute("UPDATE outbox_schema_migrations SET checksum = 'earlier' WHERE version = '0008'")
    conn.execute("DROP FUNCTION outbox_lease_lost_detail")
    assert drift_of(db_url, declared) == []


@pytest.fixture
def granted(db_url: str) -> Iterator[str]:
    roles.grant_roles(db_url)
    yield db_url


def test_grants_missing_on_a_new_table_name_the_role_and_the_fix(granted, conn, declared):
    assert drift_of(granted, declared) == []
    schema.create_table(granted, "billing_outbox")
    found = drift_of(granted, [*declared, "billing_outbox"])
    producer = next(d for d in found if d.subject == f"{roles.PRODUCER} on billing_outbox")
    assert producer.kind == "grant" and producer.severity == "error"
    inserts = producer.sentence.split(f"role {roles.PRODUCER} lacks INSERT (")[1].split(")")[0]
    assert sorted(inserts.split(", ")) == sorted(roles.ENQUEUE_COLUMNS)
    assert "id sequence" not in producer.sentence  # the producer chooses no id (issue 42)
    assert "Run 'outbox-pipelines db grant'" in producer.sentence
    assert {d.subject for d in found} == {
        f"{role} on billing_outbox" for role in roles.role_names() if _on_outbox_tables(role)
    }
    roles.grant_roles(granted)
    assert drift_of(granted, [*declared, "billing_outbox"]) == []
    conn.execute(f"REVOKE USAGE ON SCHEMA public FROM PUBLIC, {roles.RELAY}")  # PUBLIC's would stand for it
    [schema_usage] = drift_of(granted, declared)
    assert schema_usage.subject == f"{roles.RELAY} on the schema"


def _on_outbox_tables(role: str) -> bool:
    spec = next(s for s in roles.all_roles() if s.name == role)
    return any(g.table == roles.EVERY_OUTBOX_TABLE for g in spec.grants)


def test_roles_never_granted_in_this_database_are_not_drift(db_url, pg_server, declared):
    """Roles are the cluster's: a database where db grant never ran does not use them."""
    name, other = pg_server.create_database()
    try:
        roles.grant_roles(other)  # the roles exist now, granted in another database only
        assert drift_of(db_url, declared) == []
    finally:
        pg_server.drop_database(name)


def test_db_status_prints_the_drift_and_exits_1_until_it_is_fixed(cli_env, conn):
    clean = run_cli(cli_env, "db", "status")
    assert clean.returncode == 0 and "drift" not in clean.stdout, clean.stdout
    conn.execute(f"DROP INDEX {TABLE}_dead_by_code")
    conn.execute(
        "CREATE OR REPLACE FUNCTION outbox_ordering_stripe(ordering_key text) RETURNS integer "
        "LANGUAGE sql AS $$ SELECT 1 $$"
    )
    drifted = run_cli(cli_env, "db", "status")
    assert drifted.returncode == 1
    lines = [line for line in drifted.stdout.splitlines() if line.startswith("drift: ")]
    assert len(lines) == 2, drifted.stdout
    assert f"drift: index {TABLE}_dead_by_code of outbox table {TABLE} is missing" in lines[0]
    assert "drift: function outbox_ordering_stripe differs" in lines[1]


def test_a_login_that_may_not_read_the_record_is_not_told_a_function_drifted(db_url, conn, declared):
    """A login without SELECT on outbox_schema_migrations cannot read the checksums: it claims no function drift."""
    role = f"drift_probe_{conn.info.backend_pid}"
    conn.execute(f"CREATE ROLE {role} NOLOGIN")
    try:
        conn.execute("DROP FUNCTION outbox_lease_lost_detail")
        with psycopg.connect(db_url, autocommit=True) as other:
            other.execute(f"SET ROLE {role}")
            assert find_drift(other, declared, load_settings().parts) == []
        assert [d.kind for d in drift_of(db_url, declared)] == ["function"]
    finally:
        conn.execute(f"DROP ROLE {role}")
