"""Migrations: ordered, recorded, idempotent, safe in parallel, tamper-evident."""

import multiprocessing
import shutil

import psycopg
import pytest

from outbox_pipelines.core.errors import InvalidTableName, MigrationError
from outbox_pipelines.core.names import RESERVED_TABLE_NAMES
from outbox_pipelines.core.storage import migrate, schema
from outbox_pipelines.core.storage.queries import sql_dir
from outbox_pipelines_tests.core.earlier_versions import CHANGED_FOR_PARTS, migrations_before_parts

ENGINE_TABLES = set(RESERVED_TABLE_NAMES) - {"outbox_schema_version"}  # a view, not a table


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_upgrade_applies_in_order_and_is_idempotent(empty_db):
    shipped = [m.name for m in migrate.discover()]
    assert shipped[:4] == ["0001_core.sql", "0002_shipped_tables.sql", "0003_orders_and_members.sql", "0004_oncall.sql"]
    assert migrate.upgrade(empty_db) == shipped
    assert migrate.upgrade(empty_db) == []
    assert migrate.pending(empty_db) == []
    # The engine's tables only: the order product's and the examples' are parts a project declares.
    assert _tables(empty_db) == ENGINE_TABLES
    assert migrate.pending(empty_db, parts=["orders"]) == ["orders/0001_orders.sql"]
    assert migrate.upgrade(empty_db, parts=["orders"]) == ["orders/0001_orders.sql"]
    assert _tables(empty_db) == {*ENGINE_TABLES, "outbox_orders", "idempo_ledger", "outbox_api_secret"}
    assert migrate.upgrade(empty_db, parts=["orders", "examples"]) == ["examples/0001_examples.sql"]
    assert {"outbox_memory", "outbox_events", "outbox_members", "automated_email_recipients"} <= _tables(empty_db)


def _upgrade(url, results):
    try:
        results.put(("ok", migrate.upgrade(url)))
    except Exception as exc:  # reported to the parent
        results.put(("error", repr(exc)))


def test_two_processes_upgrading_at_once(empty_db):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_upgrade, args=(empty_db, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted((results.get(timeout=5) for _ in procs), key=lambda r: len(r[1]))
    assert [o[0] for o in outcomes] == ["ok", "ok"]
    assert outcomes[0][1] == [] and len(outcomes[1][1]) == len(migrate.discover())


def test_an_edited_applied_migration_is_a_clear_error(empty_db, tmp_path):
    copy = tmp_path / "migrations"
    shutil.copytree(sql_dir() / "migrations", copy)
    migrate.upgrade(empty_db, copy)
    edited = copy / "0002_shipped_tables.sql"
    edited.write_text(edited.read_text() + "\n-- a later edit\n")
    with pytest.raises(MigrationError, match="0002_shipped_tables.sql was edited after it was applied.*new migration"):
        migrate.upgrade(empty_db, copy)


def test_a_failing_migration_rolls_back_and_says_which(empty_db, tmp_path):
    copy = tmp_path / "migrations"
    shutil.copytree(sql_dir() / "migrations", copy)
    (copy / "0099_broken.sql").write_text("CREATE TABLE ok_then (id int);\nSELECT no_such_function();\n")
    with pytest.raises(MigrationError, match="0099_broken.sql failed and was rolled back"):
        migrate.upgrade(empty_db, copy)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('ok_then')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM outbox_schema_migrations").fetchone()[0] == len(migrate.discover())


def test_the_earlier_text_of_each_changed_file_is_the_one_databases_recorded():
    """The fixture holds exactly the files migrate.EARLIER_CHECKSUMS accepts, with those checksums."""
    earlier = {m.version: m.checksum for m in migrate.discover(CHANGED_FOR_PARTS)}
    assert earlier == migrate.EARLIER_CHECKSUMS


def _upgrade_to(url: str, tmp_path, last: str) -> None:
    """Apply the migrations of the version before parts up to and including ``last`` (what it left)."""
    migrate.upgrade(url, migrations_before_parts(tmp_path, last))


def test_a_database_migrated_before_parts_keeps_their_tables_and_rows(empty_db, tmp_path):
    """A database migrated when every database got the demo's tables: upgrading it (a project declaring no part)
    accepts the engine files that changed since, drops nothing, and declaring the parts later adds no copy."""
    migrate.upgrade(empty_db, migrations_before_parts(tmp_path))
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('e-1', 't', '{}', 's')")
        conn.execute("INSERT INTO idempo_ledger (idempotency_key, request_digest, event_id) VALUES ('k', 'd', 'o-1')")
    before = _tables(empty_db)
    assert migrate.upgrade(empty_db) == [m.name for m in migrate.discover() if m.version > "0012"]
    assert _tables(empty_db) == before | {"outbox_table_owners"}
    assert migrate.upgrade(empty_db, parts=["orders", "examples"]) == [
        "orders/0001_orders.sql",
        "examples/0001_examples.sql",
    ]
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT event_id FROM outbox_events").fetchall() == [("e-1",)]
        assert conn.execute("SELECT idempotency_key, event_id FROM idempo_ledger").fetchall() == [("k", "o-1")]
    assert _tables(empty_db) == before | {"outbox_table_owners"}


def test_ledger_rows_accepted_before_0007_get_the_event_id_of_their_outbox_row(empty_db, tmp_path):
    _upgrade_to(empty_db, tmp_path, "0006")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        # What the API stored before: the ledger key in the outbox row's headers, event id "<scope>:<key>".
        conn.execute(
            "INSERT INTO idempo_ledger (idempotency_key, scope, request_digest) "
            "VALUES ('k-open', '', 'd1'), ('k-caller', 'h:abc', 'd2'), ('k-gone', '', 'd3')"
        )
        conn.execute("""INSERT INTO outbox_orders (event_id, topic, payload, payload_sha, headers) VALUES
            ('k-open', 'order.submitted', '{}', 's1', '{"ledger_scope": "", "ledger_key": "k-open"}'),
            ('h:abc:k-caller', 'order.submitted', '{}', 's2', '{"ledger_scope": "h:abc", "ledger_key": "k-caller"}'),
            ('direct-1', 'order.submitted', '{}', 's3', '{}')""")
    migrate.upgrade(empty_db, parts=["orders"])
    with psycopg.connect(empty_db) as conn:
        found = dict(conn.execute("SELECT idempotency_key, event_id FROM idempo_ledger").fetchall())
        assert found == {"k-open": "k-open", "k-caller": "h:abc:k-caller", "k-gone": None}
        with pytest.raises(psycopg.errors.UniqueViolation):  # one ledger row per message
            conn.execute("UPDATE idempo_ledger SET event_id = 'k-open' WHERE idempotency_key = 'k-gone'")


def test_0007_applies_to_a_database_without_outbox_orders(empty_db, tmp_path):
    _upgrade_to(empty_db, tmp_path, "0006")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("DROP TABLE outbox_orders")
    _upgrade_to(empty_db, tmp_path, "0007")
    with psycopg.connect(empty_db) as conn:
        applied = [r[0] for r in conn.execute("SELECT version FROM outbox_schema_migrations ORDER BY version")]
    assert applied[-1] == "0007"
    migrate.upgrade(empty_db)  # and today's engine over it
    assert "outbox_orders" not in _tables(empty_db)


def test_part_tables_have_the_shape_the_engine_migrations_gave_them(empty_db, pg_server, tmp_path):
    """The order product's and the examples' tables made by their parts' migrations today are those the engine's
    migrations made before: same columns, indexes, constraints and triggers."""
    old_name = f"{pg_server.prefix}_before_parts"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{old_name}"')
    try:
        old_url = pg_server.url_for(old_name)
        migrate.upgrade(old_url, migrations_before_parts(tmp_path))
        migrate.upgrade(old_url)
        migrate.upgrade(empty_db, parts=["orders", "examples"])
        assert _shape(empty_db) == _shape(old_url)
    finally:
        pg_server.drop_database(old_name)


def _shape(url: str) -> dict[str, list[tuple]]:
    """Columns, indexes, constraints and triggers of every table of the public schema."""
    with psycopg.connect(url) as conn:
        return {
            "columns": conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns"
                " WHERE table_schema = 'public' AND table_name <> 'outbox_schema_migrations' ORDER BY 1, 2"
            ).fetchall(),
            "indexes": conn.execute(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1, 2"
            ).fetchall(),
            "constraints": conn.execute(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"
            ).fetchall(),
            "triggers": conn.execute(
                "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2"
            ).fetchall(),
        }


def test_create_table_makes_the_canonical_shape(db_url, conn):
    assert schema.create_table(db_url, "hrm_outbox", dedup_index=True) is True
    assert schema.create_table(db_url, "hrm_outbox") is False
    columns = [
        r["column_name"]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'hrm_outbox' ORDER BY ordinal_position"
        )
    ]
    assert columns == [
        "id",
        "event_id",
        "tenant_id",
        "topic",
        "payload",
        "payload_sha",
        "headers",
        "status",
        "attempts",
        "available_at",
        "locked_by",
        "locked_at",
        "lease_expires_at",
        "last_error",
        "last_error_code",
        "result_ref",
        "created_at",
        "updated_at",
        "published_at",
        "ordering_key",
        "ordering_blocked",
        "ordering_skipped_at",
        "json_bytes",
    ]
    indexes = {r["indexname"] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'hrm_outbox'")}
    assert {
        "hrm_outbox_ready_by_id",
        "hrm_outbox_pending_by_available",
        "hrm_outbox_sent_by_published",
        "hrm_outbox_sending_by_lease",
        "hrm_outbox_sent_by_payload",
        "hrm_outbox_event_id_key",
        "hrm_outbox_blocked_by_key",
        "hrm_outbox_by_ordering_key",
        "hrm_outbox_sending_by_key",
    } <= indexes
    assert "hrm_outbox_pending_by_id" not in indexes  # replaced by ready_by_id (migration 0010)
    assert "hrm_outbox" in schema.list_tables(db_url)


def test_create_table_with_a_63_character_name_keeps_index_names_distinct(db_url, conn):
    name = "a" * 63
    schema.create_table(db_url, name)
    indexes = [r["indexname"] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (name,))]
    # pkey, event_id, pending, sending, sent, dead, tenant; ordering: ready, blocked, by key, sending by key
    assert len(indexes) == len(set(indexes)) == 11


def test_create_table_refuses_bad_names_in_python_and_in_sql(db_url, conn):
    with pytest.raises(InvalidTableName):
        schema.create_table(db_url, 'x"; DROP TABLE outbox_orders; --')
    with pytest.raises(psycopg.errors.InvalidName):
        conn.execute("SELECT outbox_create_table('Bad Name')")
    assert conn.execute("SELECT to_regclass('outbox_orders') IS NOT NULL AS ok").fetchone()["ok"]
