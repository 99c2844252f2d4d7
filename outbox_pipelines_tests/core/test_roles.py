"""`outbox-pipelines db grant`: each group role can do its job and nothing more.

Each test logs in as a login role of its own (unique name, dropped at the end: roles are
cluster-wide and test sessions may share a server) that is a member of one group role.
The group roles themselves are fixed and shared; granting them is idempotent.
"""

import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow

from outbox_pipelines.core import migrate, roles
from outbox_pipelines.core.destinations.paper import PaperBroker
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.health import read_status
from outbox_pipelines.core.maintenance import clean, clean_shared
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.oncall import sweep
from outbox_pipelines.core.orders import ORDERS_TABLE
from outbox_pipelines.core.orders.ledger import accept_order
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.schema import create_table
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.table import OutboxTable
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import enqueue_n, order_payload

DictConnection = psycopg.Connection[DictRow]
LoginAs = Callable[[str], str]
DENIED = psycopg.errors.InsufficientPrivilege
INSERT_EVENT = "INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('x', 't', '{}', 's')"


@pytest.fixture
def granted(db_url: str) -> str:
    roles.grant_roles(db_url)
    return db_url


@pytest.fixture
def login_as(granted: str) -> Iterator[LoginAs]:
    """Make a login role in the given group role; its URL on the test database."""
    made: list[str] = []
    params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(granted).items() if v is not None}
    database = params.pop("dbname")

    def make(group: str) -> str:
        name = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}_{group.removeprefix('outbox_')}"
        password = secrets.token_hex(16)  # for a server that checks passwords (OUTBOX_TEST_DATABASE_URL)
        with psycopg.connect(granted, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                sql.Identifier(name), sql.Literal(password), sql.Identifier(group)))
        made.append(name)
        return f"postgresql:///{database}?" + urlencode({**params, "user": name, "password": password})

    yield make
    with psycopg.connect(granted, autocommit=True) as admin:
        for name in made:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _denied(url: str, statement: str, params: tuple[object, ...] = ()) -> bool:
    """True if the role of ``url`` may not run ``statement`` (nothing is committed either way)."""
    with psycopg.connect(url) as conn:
        try:
            conn.execute(statement, params)
        except DENIED:
            return True
        finally:
            conn.rollback()
    return False


def _value(conn: DictConnection, query: str, params: tuple[object, ...] = ()) -> object:
    """The first column of the statement's one row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return next(iter(row.values()))


def _table_acls(conn: DictConnection) -> dict[str, object]:
    rows = conn.execute("SELECT relname, relacl::text AS acl, "
                        "ARRAY(SELECT attname || '=' || attacl::text FROM pg_attribute "
                        "      WHERE attrelid = c.oid AND attacl IS NOT NULL ORDER BY attnum) AS columns "
                        "FROM pg_class AS c WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace "
                        "ORDER BY relname").fetchall()
    return {row["relname"]: (row["acl"], row["columns"]) for row in rows}


def test_producer_enqueues_and_tells_a_duplicate_but_cannot_read_change_or_delete(login_as: LoginAs) -> None:
    url = login_as(roles.PRODUCER)
    with psycopg.connect(url) as conn:
        first = Outbox("outbox_events").enqueue(conn, Message(topic="t", payload={"n": 1}, event_id="e1"))
        again = Outbox("outbox_events").enqueue(conn, Message(topic="t", payload={"n": 2}, event_id="e1"))
        many = Outbox("outbox_memory").enqueue_many(conn, [Message(topic="t", payload={"n": i}) for i in range(3)])
        conn.commit()
    assert not first.duplicate and again.duplicate and again.id == first.id and not again.same_payload
    assert len(many) == 3 and not any(r.duplicate for r in many)
    assert _denied(url, "SELECT payload FROM outbox_events")
    assert _denied(url, "SELECT * FROM outbox_events")
    assert _denied(url, "UPDATE outbox_events SET status = 'sent'")
    assert _denied(url, "DELETE FROM outbox_events")
    assert _denied(url, "SELECT 1 FROM idempo_ledger")
    assert _denied(url, "INSERT INTO outbox_audit (outbox_table, code) VALUES ('outbox_events', 'x')")
    assert _denied(url, "TRUNCATE outbox_events")


def test_producer_enqueues_through_the_cli(login_as: LoginAs, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "OUTBOX_DATABASE_URL": login_as(roles.PRODUCER)}
    for expected in ("enqueued row", "duplicate: event cli-1"):
        result = run_cli(env, "enqueue", "--table", "outbox_events", "--topic", "org.changed", "--payload", "{}",
                         "--event-id", "cli-1")
        assert result.returncode == 0 and expected in result.stdout, result.stderr


def test_relay_delivers_with_its_heartbeat_and_audit_but_cannot_enqueue_or_clean(
        login_as: LoginAs, conn: DictConnection) -> None:
    enqueue_n(conn, "outbox_events", 5)
    url = login_as(roles.RELAY)
    report = Relay(url, table_settings("outbox_events", batch_size=2), PaperBroker()).run(once=True)
    assert report.sent == 5
    assert _value(conn, "SELECT count(*) FROM outbox_events WHERE status = 'sent'") == 5
    assert _value(conn, "SELECT stopped_at IS NOT NULL FROM outbox_relay_workers") is True
    assert _value(conn, "SELECT count(*) FROM outbox_audit WHERE code = 'outbox_claim'") == 5
    assert _denied(url, INSERT_EVENT)
    assert _denied(url, "DELETE FROM outbox_audit")
    assert _denied(url, "DELETE FROM idempo_ledger")
    assert _denied(url, "SELECT 1 FROM outbox_api_secret")
    assert _denied(url, "INSERT INTO outbox_alert_state (alert_key, severity) VALUES ('k', 'ok')")


def test_reader_reads_status_through_the_cli_but_cannot_write(
        login_as: LoginAs, conn: DictConnection, cli_env: dict[str, str]) -> None:
    enqueue_n(conn, "outbox_events", 3)
    url = login_as(roles.READER)
    result = run_cli({**cli_env, "OUTBOX_DATABASE_URL": url}, "status", "--table", "outbox_events", "--json")
    assert result.returncode == 0, result.stderr
    assert '"pending": 3' in result.stdout
    with psycopg.connect(url) as reader:
        assert read_status(OutboxTable(reader, "outbox_orders")).counts["pending"] == 0
    assert _denied(url, "UPDATE outbox_events SET status = 'dead'")
    assert _denied(url, "DELETE FROM outbox_events")
    assert _denied(url, INSERT_EVENT)
    assert _denied(url, "INSERT INTO outbox_alert_state (alert_key, severity) VALUES ('k', 'ok')")
    assert _denied(url, "SELECT 1 FROM idempo_ledger")
    assert _denied(url, "SELECT 1 FROM outbox_api_secret")


def test_maintainer_cleans_replays_and_runs_the_oncall_sweep(login_as: LoginAs, conn: DictConnection) -> None:
    ids = enqueue_n(conn, "outbox_events", 4)
    conn.execute("UPDATE outbox_events SET status = 'sent', published_at = now() - interval '30 days' "
                 "WHERE id = ANY(%s)", (ids[:2],))
    conn.execute("UPDATE outbox_events SET status = 'dead', last_error_code = 'BROKER_5XX' WHERE id = ANY(%s)",
                 (ids[2:],))
    conn.execute("INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) "
                 "VALUES ('old', 'd', now() - interval '1 hour')")
    url = login_as(roles.MAINTAINER)
    assert clean(url, table_settings("outbox_events"), retention_s=timedelta(days=7).total_seconds()).deleted_sent == 2
    shared = clean_shared(url, audit_retention_s=3600.0)
    assert shared.deleted_ledger == 1
    # The Dagster code location's on-call sensor: two dead letters fire an alert, remembered.
    report = sweep(url, load_settings(env={}, path=None))
    assert not report.problems and report.alerts
    assert _value(conn, "SELECT count(*) > 0 FROM outbox_alert_state") is True
    assert replay_dead(url, "outbox_events", ReplayFilter(error_code="BROKER_5XX")).replayed == 2
    assert _denied(url, INSERT_EVENT)
    assert _denied(url, "SELECT 1 FROM outbox_api_secret")
    assert _denied(url, "TRUNCATE outbox_events")


def test_order_api_accepts_an_order_but_cannot_delete(login_as: LoginAs, conn: DictConnection) -> None:
    url = login_as(roles.ORDER_API)
    assert migrate.pending(url) == []
    with psycopg.connect(url) as api:
        assert accept_order(api, "", order_payload(1)).kind == "accepted"
        api.commit()
        assert accept_order(api, "", order_payload(1)).kind == "replay"
        api.execute("INSERT INTO outbox_api_secret (secret) VALUES (%s) ON CONFLICT (id) DO NOTHING",
                    (secrets.token_hex(32),))
        assert api.execute("SELECT secret FROM outbox_api_secret WHERE id").fetchone() is not None
        api.commit()
    assert _value(conn, f"SELECT count(*) FROM {ORDERS_TABLE}") == 1
    assert _denied(url, "DELETE FROM idempo_ledger")
    assert _denied(url, f"DELETE FROM {ORDERS_TABLE}")
    assert _denied(url, f"UPDATE {ORDERS_TABLE} SET status = 'sent'")
    assert _denied(url, "UPDATE idempo_ledger SET status = 'succeeded'")
    assert _denied(url, INSERT_EVENT)


def test_order_api_role_starts_on_a_migrated_database(login_as: LoginAs) -> None:
    # What `outbox-pipelines order-api` runs as it starts: nothing is left to apply.
    assert migrate.upgrade(login_as(roles.ORDER_API)) == []


def test_grant_is_idempotent_and_a_rerun_reaches_a_new_table(granted: str, conn: DictConnection,
                                                             login_as: LoginAs) -> None:
    before = _table_acls(conn)
    plan, _ = roles.grant_roles(granted)
    assert plan.missing_roles == [] and _table_acls(conn) == before
    create_table(granted, "hrm_outbox")
    url = login_as(roles.PRODUCER)
    assert _denied(url, "INSERT INTO hrm_outbox (event_id, topic, payload, payload_sha) VALUES ('x', 't', '{}', 's')")
    roles.grant_roles(granted)
    with psycopg.connect(url) as producer:
        assert not Outbox("hrm_outbox").enqueue(producer, Message(topic="t", payload={})).duplicate
        producer.commit()


def test_grant_converges_an_extra_right_away(granted: str, conn: DictConnection) -> None:
    conn.execute(sql.SQL("GRANT DELETE ON outbox_events TO {}").format(sql.Identifier(roles.PRODUCER)))
    roles.grant_roles(granted)
    assert _value(conn, "SELECT has_table_privilege(%s, 'outbox_events', 'DELETE')", (roles.PRODUCER,)) is False


def test_cli_db_grant_dry_run_prints_the_sql_and_changes_nothing(
        db_url: str, conn: DictConnection, cli_env: dict[str, str]) -> None:
    before = _table_acls(conn)
    result = run_cli(cli_env, "db", "grant", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert 'GRANT INSERT ON TABLE "outbox_events" TO "outbox_producer";' in result.stdout
    assert 'GRANT SELECT ("id", "event_id", "payload_sha") ON TABLE "outbox_events" TO "outbox_producer";' \
        in result.stdout
    assert "dry run: nothing changed" in result.stdout
    assert _table_acls(conn) == before
    result = run_cli(cli_env, "db", "grant")
    assert result.returncode == 0, result.stderr
    assert "outbox_producer" in result.stdout and "again after 'db create-table'" in result.stdout
    assert _table_acls(conn) != before


def test_cli_db_grant_refuses_a_role_that_does_not_own_the_tables(
        login_as: LoginAs, conn: DictConnection, cli_env: dict[str, str]) -> None:
    before = _table_acls(conn)
    result = run_cli({**cli_env, "OUTBOX_DATABASE_URL": login_as(roles.MAINTAINER)}, "db", "grant")
    assert result.returncode == 1
    assert "does not own schema public, " in result.stderr and "run 'outbox-pipelines db grant' as" in result.stderr
    assert _table_acls(conn) == before


def test_the_order_api_role_names_the_wing_s_table() -> None:
    assert roles.ORDERS_TABLE == ORDERS_TABLE


def test_the_maintainer_holds_every_right_of_the_relay() -> None:
    def rights(spec: roles.RoleSpec) -> set[tuple[str, str]]:
        return {(grant.table, privilege) for grant in spec.grants for privilege in grant.privileges}

    by_name = {spec.name: spec for spec in roles.ROLES}
    assert rights(by_name[roles.RELAY]) <= rights(by_name[roles.MAINTAINER])
