"""What a team's project gets in a shared database, tried with its own commands: only the tables it declares,
no database it did not ask for, no table another project owns, and a word about tables nobody declares."""

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines.core.names import RESERVED_TABLE_NAMES
from outbox_pipelines.core.oncall.sweep import sweep
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage import migrate
from outbox_pipelines.core.storage.online_steps import runs_outside_a_transaction, statements
from outbox_pipelines_tests.conftest import REPO, run_cli


@pytest.fixture
def empty_db(pg_server):
    """A database nothing was ever migrated in (a team's production database, as far as we are concerned)."""
    name = f"{pg_server.prefix}_team_{os.urandom(4).hex()}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url_for(name)
    pg_server.drop_database(name)


def _project(root: Path, name: str, outbox_toml: str) -> Path:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "1.0"\n')
    (root / "outbox.toml").write_text(outbox_toml)
    return root


def _env(url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["PYTHONPATH"] = str(REPO)
    if url:
        env["OUTBOX_DATABASE_URL"] = url
    return {**env, **extra}


def _tables(url: str) -> set[str]:
    """The tables and views of the schema (the engine's names include a view, outbox_schema_version)."""
    with psycopg.connect(url) as conn:
        return {
            r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        }


BILLING = '[tables.billing_outbox]\ndestination = "paper"\n'


def test_db_upgrade_of_a_one_table_project_creates_the_engine_tables_and_that_table(empty_db, tmp_path):
    billing = _project(tmp_path / "billing", "billing", BILLING)
    done = run_cli(_env(empty_db), "db", "upgrade", cwd=billing)
    assert done.returncode == 0, done.stderr
    assert "created outbox table billing_outbox" in done.stdout
    assert "outbox tables of this project (billing): billing_outbox" in done.stdout
    assert _tables(empty_db) == {*RESERVED_TABLE_NAMES, "billing_outbox"}
    again = run_cli(_env(empty_db), "db", "upgrade", cwd=billing)
    assert again.returncode == 0 and "database is up to date" in again.stdout
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT outbox_table, project FROM outbox_table_owners").fetchall() == [
            ("billing_outbox", "billing")
        ]


def test_a_project_that_declares_the_order_product_gets_its_tables_and_no_others(empty_db, tmp_path):
    shop = _project(
        tmp_path / "shop", "shop", 'parts = ["orders"]\n[tables.outbox_orders]\nurl = "http://127.0.0.1:9"\n'
    )
    done = run_cli(_env(empty_db), "db", "upgrade", cwd=shop)
    assert done.returncode == 0, done.stderr
    assert _tables(empty_db) == {*RESERVED_TABLE_NAMES, "outbox_orders", "idempo_ledger", "outbox_api_secret"}
    typo = _project(tmp_path / "typo", "typo", 'parts = ["order"]\n')
    refused = run_cli(_env(empty_db), "db", "upgrade", cwd=typo)
    assert refused.returncode == 2
    assert "unknown part 'order'" in refused.stderr and "examples, orders" in refused.stderr


def test_the_order_api_needs_the_project_to_declare_the_order_product(empty_db, tmp_path):
    billing = _project(tmp_path / "billing", "billing", BILLING)
    refused = run_cli(_env(empty_db), "order-api", "--port", "0", cwd=billing)
    assert refused.returncode == 2
    assert 'parts = ["orders"]' in refused.stderr
    assert _tables(empty_db) == set()  # refused before anything was touched


def test_a_second_project_cannot_take_a_table_another_project_owns_without_a_hand_over(empty_db, tmp_path):
    billing = _project(tmp_path / "billing", "billing", BILLING)
    intruder = _project(tmp_path / "intruder", "intruder", BILLING)
    assert run_cli(_env(empty_db), "db", "upgrade", cwd=billing).returncode == 0
    for n in range(3):
        enqueued = run_cli(
            _env(empty_db),
            "enqueue",
            "--table",
            "billing_outbox",
            "--topic",
            "t",
            "--payload",
            f'{{"n": {n}}}',
            cwd=billing,
        )
        assert enqueued.returncode == 0, enqueued.stderr

    refused = run_cli(_env(empty_db), "db", "upgrade", cwd=intruder)
    assert refused.returncode == 1
    assert "billing_outbox belongs to the project 'billing'" in refused.stderr
    assert "db hand-over billing_outbox --from billing" in refused.stderr
    assert "outbox tables of this project (intruder)" not in refused.stdout, "not listed as its own"
    assert "declares no outbox table" not in refused.stdout, refused.stdout
    relay = run_cli(_env(empty_db), "relay", "--table", "billing_outbox", "--once", cwd=intruder)
    assert relay.returncode == 2 and "belongs to the project 'billing'" in relay.stderr
    group = run_cli(_env(empty_db), "relay", "--group", "default", "--once", cwd=intruder)
    assert group.returncode == 2 and "belongs to the project 'billing'" in group.stderr
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT count(*) FROM billing_outbox WHERE status = 'pending'").fetchone() == (3,)

    wrong = run_cli(_env(empty_db), "db", "hand-over", "billing_outbox", "--from", "someone", cwd=intruder)
    assert wrong.returncode == 2 and "belongs to 'billing', not 'someone'" in wrong.stderr
    moved = run_cli(_env(empty_db), "db", "hand-over", "billing_outbox", "--from", "billing", cwd=intruder)
    assert moved.returncode == 0, moved.stderr
    assert "handed over from 'billing' to 'intruder'" in moved.stdout
    old_owner = run_cli(_env(empty_db), "relay", "--table", "billing_outbox", "--once", cwd=billing)
    assert old_owner.returncode == 2 and "belongs to the project 'intruder'" in old_owner.stderr
    new_owner = run_cli(_env(empty_db), "relay", "--table", "billing_outbox", "--once", cwd=intruder)
    assert new_owner.returncode == 0, new_owner.stderr
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT count(*) FROM billing_outbox WHERE status = 'sent'").fetchone() == (3,)


def test_a_missing_database_url_is_an_error_not_a_throwaway_database(tmp_path):
    """An application container's /app: a pyproject.toml, no .outbox/, the variable misspelt."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text('[project]\nname = "app"\nversion = "1"\n')
    env = _env(OUTBOX_DATABASE_ULR="postgresql://app@db.internal/app")
    for command in (["db", "upgrade"], ["status"], ["relay", "--group", "default", "--once"]):
        done = run_cli(env, *command, cwd=app)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "OUTBOX_DATABASE_URL is unset (OUTBOX_DATABASE_ULR is set: a typo?)" in done.stderr
    assert not (app / ".outbox").exists()
    library = subprocess.run(
        [sys.executable, "-c", "import outbox_pipelines; outbox_pipelines.database_url()"],
        env=env,
        cwd=app,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert library.returncode == 1 and "ConfigError: OUTBOX_DATABASE_URL is unset" in library.stderr
    assert not (app / ".outbox").exists()


def test_an_undeclared_table_with_waiting_messages_alerts_once(db_url, tmp_path, monkeypatch):
    """The template database has the examples' tables; a project declaring only its own table is told once
    about the messages waiting in one it does not declare, and not about another project's table."""
    billing = _project(tmp_path / "billing", "billing", BILLING)
    monkeypatch.chdir(billing)
    settings = load_settings(env={})
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('e-1', 't', '{}', 's')")
        conn.execute(
            "INSERT INTO outbox_members (event_id, topic, payload, payload_sha) VALUES ('m-1', 't', '{}', 's')"
        )
        conn.execute("INSERT INTO outbox_table_owners (outbox_table, project) VALUES ('outbox_members', 'members')")
    first = sweep(db_url, settings)
    told = [a for a in first.alerts if a.get("kind") == "undeclared_table"]
    assert [a["table"] for a in told] == ["outbox_events"], first.alerts
    assert "1 message wait there that no relay will deliver" in told[0]["summary"]
    second = sweep(db_url, settings)
    assert [a for a in second.alerts if a.get("kind") == "undeclared_table"] == []
    status = run_cli(_env(db_url), "status", cwd=billing)
    assert "declared nowhere in this project: outbox_events (1 waiting)" in status.stdout
    assert "outbox_members" not in status.stdout.split("declared nowhere")[1]


def test_dry_run_and_sql_show_the_pending_steps_and_change_nothing_and_the_script_upgrades(empty_db, tmp_path):
    """A team that runs schema changes through its own tool: --dry-run lists, --sql prints a script that, run as
    is, leaves the database where db upgrade would (db status then says nothing is pending)."""
    billing = _project(tmp_path / "billing", "billing", BILLING)
    env = _env(empty_db)
    status, needs = run_cli(env, "db", "status", cwd=billing), migrate.needed_version()
    assert status.returncode == 1 and f"schema: none applied; this version needs {needs}" in status.stdout
    dry = run_cli(env, "db", "upgrade", "--dry-run", cwd=billing)
    assert dry.returncode == 0, dry.stderr
    assert "-- would apply 0001_core.sql (in one transaction)" in dry.stdout
    assert "would create outbox table billing_outbox (owned by billing)" in dry.stdout
    assert _tables(empty_db) == set()
    script = run_cli(env, "db", "upgrade", "--sql", cwd=billing)
    assert script.returncode == 0 and _tables(empty_db) == set()
    in_a_transaction = [m for m in migrate.discover() if not runs_outside_a_transaction(m.sql)]
    assert script.stdout.count("BEGIN;") == len(in_a_transaction)
    assert (
        "SET lock_timeout = 0;\nCREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_audit_by_message_brin" in script.stdout
    )
    with psycopg.connect(empty_db, autocommit=True) as conn:
        for statement in statements(script.stdout):  # as psql or the team's tool runs it: one statement at a time
            conn.execute(statement.encode())
    assert _tables(empty_db) == {*RESERVED_TABLE_NAMES, "billing_outbox"}
    after = run_cli(env, "db", "status", cwd=billing)
    assert after.returncode == 0 and "pending: none" in after.stdout, after.stdout
    again = run_cli(env, "db", "upgrade", cwd=billing)
    assert again.returncode == 0 and "database is up to date" in again.stdout
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT project FROM outbox_table_owners").fetchall() == [("billing",)]


def test_a_relay_on_a_schema_older_than_its_code_refuses_with_one_message(empty_db, tmp_path):
    billing = _project(tmp_path / "billing", "billing", BILLING)
    assert run_cli(_env(empty_db), "db", "upgrade", cwd=billing).returncode == 0
    with psycopg.connect(empty_db, autocommit=True) as conn:  # the schema as the previous version left it
        conn.execute("DELETE FROM outbox_schema_migrations WHERE version > '0012' AND version !~ '/'")
    for command in (
        ["relay", "--table", "billing_outbox", "--once"],
        ["relay", "--group", "default", "--once"],
        ["status"],
        ["requeue-stuck"],
    ):
        refused = run_cli(_env(empty_db), *command, cwd=billing)
        assert refused.returncode == 1, refused.stderr
        assert f"the database schema is at 0012, this version needs {migrate.needed_version()}" in refused.stderr
        assert "run 'outbox-pipelines db upgrade'" in refused.stderr and "Traceback" not in refused.stderr


def test_the_order_api_refuses_a_database_that_lacks_a_migration_unless_asked_to_upgrade(empty_db, tmp_path):
    shop = _project(tmp_path / "shop", "shop", 'parts = ["orders"]\n')
    refused = run_cli(_env(empty_db), "order-api", "--port", "0", cwd=shop)
    assert refused.returncode == 1
    assert "the database lacks 0001_core.sql" in refused.stderr and "orders/0001_orders.sql" in refused.stderr
    assert "run 'outbox-pipelines db upgrade' (or start it with --upgrade)" in refused.stderr
    assert _tables(empty_db) == set()


def test_the_relay_check_of_a_table_another_project_owns_fails_saying_whose_it_is(empty_db, tmp_path, monkeypatch):
    """A second code location declaring a table the first owns: none of its relay runs takes the table, and its
    relay check says so (ERROR, the owner named) instead of "its relay group can relay it"."""
    from outbox_pipelines.core.oncall.sweep import table_verdicts

    billing = _project(tmp_path / "billing", "billing", BILLING)
    assert run_cli(_env(empty_db), "db", "upgrade", cwd=billing).returncode == 0
    intruder = _project(tmp_path / "intruder", "intruder", BILLING)
    verdicts = {}
    for root in (billing, intruder):
        monkeypatch.chdir(root)  # each project's settings, read in its directory as its processes read them
        settings = load_settings(env={}, path=root / "outbox.toml")
        with psycopg.connect(empty_db) as conn:
            verdicts[settings.project] = {v.name: v for v in table_verdicts(conn, settings, "billing_outbox")}["relay"]
    assert verdicts["billing"].severity == "ok", verdicts["billing"]
    assert verdicts["intruder"].severity == "error", verdicts["intruder"]
    assert "belongs to the project 'billing'" in verdicts["intruder"].description
