"""`outbox-pipelines db grant`: each group role can do its job and nothing more.

Each test logs in as a login role of its own (unique name, dropped at the end: roles are
cluster-wide and test sessions may share a server) that is a member of one group role.
The group roles themselves are fixed and shared; granting them is idempotent.
"""

import os
import secrets
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow

from outbox_pipelines.core.destinations.paper import PaperBroker
from outbox_pipelines.core.enqueue import COPY_MIN_ROWS, Outbox
from outbox_pipelines.core.models import ClaimedMessage, Message, Outcome
from outbox_pipelines.core.oncall.health import read_status
from outbox_pipelines.core.oncall.sweep import sweep
from outbox_pipelines.core.operations.maintenance import clean, clean_shared
from outbox_pipelines.core.operations.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage import migrate, roles
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.orders import ORDERS_TABLE
from outbox_pipelines.orders.broker import OrderBroker
from outbox_pipelines.orders.wing import ORDER_API
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, accept_order, enqueue_n, order_payload, statuses
from outbox_pipelines_tests.rows import make_dead, make_sent

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
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                    sql.Identifier(name), sql.Literal(password), sql.Identifier(group)
                )
            )
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
    rows = conn.execute(
        "SELECT relname, relacl::text AS acl, "
        "ARRAY(SELECT attname || '=' || attacl::text FROM pg_attribute "
        "      WHERE attrelid = c.oid AND attacl IS NOT NULL ORDER BY attnum) AS columns "
        "FROM pg_class AS c WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace "
        "ORDER BY relname"
    ).fetchall()
    return {row["relname"]: (row["acl"], row["columns"]) for row in rows}


def test_producer_enqueues_and_tells_a_duplicate_but_cannot_read_change_or_delete(login_as: LoginAs) -> None:
    url = login_as(roles.PRODUCER)
    with psycopg.connect(url) as conn:
        first = Outbox("outbox_events").enqueue(
            conn, Message(topic="t", payload={"n": 1}, event_id="e1"), outside_transaction=True
        )
        again = Outbox("outbox_events").enqueue(
            conn, Message(topic="t", payload={"n": 2}, event_id="e1"), outside_transaction=True
        )
        many = Outbox("outbox_memory").enqueue_many(
            conn, [Message(topic="t", payload={"n": i}) for i in range(3)], outside_transaction=True
        )
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


def test_producer_enqueues_keyed_messages_and_its_commit_lets_a_free_key_go(
    login_as: LoginAs, conn: DictConnection
) -> None:
    """The commit-time check (migration 0010) clears the flag of the producer's own new row, which the
    producer itself may not update."""
    url = login_as(roles.PRODUCER)
    with psycopg.connect(url) as producer:
        first = Outbox("outbox_events").enqueue(producer, Message(topic="t", payload={}, ordering_key="a"))
        Outbox("outbox_events").enqueue(producer, Message(topic="t", payload={}, ordering_key="a"))
        producer.commit()
    waiting = [r["id"] for r in conn.execute("SELECT id FROM outbox_events WHERE ordering_blocked ORDER BY id")]
    assert len(waiting) == 1 and waiting[0] > first.id
    conn.execute("UPDATE outbox_events SET status = 'sent' WHERE id = %s", (first.id,))
    with psycopg.connect(url) as producer:  # the key is free again: a new message is not held back
        Outbox("outbox_events").enqueue(producer, Message(topic="t", payload={}, ordering_key="b"))
        producer.commit()
    assert _denied(url, "UPDATE outbox_events SET ordering_blocked = false")


def test_producer_enqueues_through_the_cli(login_as: LoginAs, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "OUTBOX_DATABASE_URL": login_as(roles.PRODUCER)}
    for expected in ("enqueued row", "duplicate: event cli-1"):
        result = run_cli(
            env,
            "enqueue",
            "--table",
            "outbox_events",
            "--topic",
            "org.changed",
            "--payload",
            "{}",
            "--event-id",
            "cli-1",
        )
        assert result.returncode == 0 and expected in result.stdout, result.stderr


def test_producer_enqueues_and_tells_a_duplicate_on_a_created_table_and_in_bulk(
    granted: str, login_as: LoginAs
) -> None:
    create_table(granted, "hrm_outbox")
    roles.grant_roles(granted)
    url = login_as(roles.PRODUCER)
    with psycopg.connect(url) as conn:
        first = Outbox("hrm_outbox").enqueue(
            conn, Message(topic="t", payload={"n": 1}, event_id="h1"), outside_transaction=True
        )
        again = Outbox("hrm_outbox").enqueue(
            conn, Message(topic="t", payload={"n": 1}, event_id="h1"), outside_transaction=True
        )
        # From COPY_MIN_ROWS on, enqueue_many writes with COPY, which reserves the ids itself.
        bulk = Outbox("outbox_events").enqueue_many(
            conn,
            [Message(topic="t", payload={"n": i}, event_id=f"b{i}") for i in range(COPY_MIN_ROWS)],
            outside_transaction=True,
        )
        repeated = Outbox("outbox_events").enqueue_many(
            conn,
            [Message(topic="t", payload={"n": i}, event_id=f"b{i}") for i in range(COPY_MIN_ROWS)],
            outside_transaction=True,
        )
        conn.commit()
    assert not first.duplicate and again.duplicate and again.id == first.id and again.same_payload
    assert not any(r.duplicate for r in bulk) and len({r.id for r in bulk}) == COPY_MIN_ROWS
    assert [r.id for r in repeated] == [r.id for r in bulk] and all(r.duplicate for r in repeated)


def test_producer_cannot_place_or_read_an_order(login_as: LoginAs) -> None:
    url = login_as(roles.PRODUCER)
    with psycopg.connect(url) as conn, pytest.raises(DENIED):
        Outbox(ORDERS_TABLE).enqueue(
            conn, Message(topic="order.place", payload=order_payload(1)), outside_transaction=True
        )
    assert _denied(
        url,
        f"INSERT INTO {ORDERS_TABLE} (event_id, topic, payload, payload_sha) VALUES ('x', 'order.place', '{{}}', 's')",
    )
    # The order wing's event ids are the callers' scoped keys: not the producer's to read.
    assert _denied(url, f"SELECT event_id FROM {ORDERS_TABLE}")
    assert _denied(url, f"SELECT id FROM {ORDERS_TABLE}")


# A producer writes a message, never how its delivery went.
FORGED_DELIVERY = {
    "status": "'sent'",
    "published_at": "now()",
    "attempts": "3",
    "locked_by": "'me'",
    "locked_at": "now()",
    "lease_expires_at": "now()",
    "last_error": "'e'",
    "last_error_code": "'E'",
    "result_ref": "'ref'",
    "updated_at": "now()",
    "created_at": "now()",
}


def test_producer_cannot_set_delivery_columns_or_update_a_message(login_as: LoginAs, conn: DictConnection) -> None:
    [row_id] = enqueue_n(conn, "outbox_events", 1)
    url = login_as(roles.PRODUCER)
    allowed = []
    for column, value in FORGED_DELIVERY.items():
        statement = (
            f"INSERT INTO outbox_events (event_id, topic, payload, payload_sha, {column}) "
            f"VALUES ('forged-{column}', 't', '{{}}', 's', {value})"
        )
        if not _denied(url, statement):
            allowed.append(column)
    assert allowed == []
    for column in ("status", "available_at", "payload", "published_at"):
        assert _denied(url, f"UPDATE outbox_events SET {column} = {column} WHERE id = %s", (row_id,)), column
    assert _value(conn, "SELECT count(*) FROM outbox_events") == 1


class _OrdersOneRejected(OrderBroker):
    """The paper order broker, except that it rejects the order whose key is key-1, for good."""

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        paper = iter(super().deliver(messages))
        rejected = Outcome.dead("BAD_REQUEST", "rejected by the test")
        return [rejected if m.payload["idempotency_key"] == "key-1" else next(paper) for m in messages]


def test_relay_role_runs_a_real_relay_end_to_end(granted: str, login_as: LoginAs, conn: DictConnection) -> None:
    url = login_as(roles.RELAY)
    # Leases: one message sent, one retried, one dead, and one whose relay died holding its lease.
    ids = enqueue_n(conn, "outbox_events", 4)
    conn.execute(
        "UPDATE outbox_events SET status = 'sending', attempts = 1, locked_by = 'gone', "
        "locked_at = now() - interval '1 hour', lease_expires_at = now() - interval '1 minute' "
        "WHERE id = %s",
        (ids[3],),
    )
    outcomes = {
        ids[0]: Outcome.sent(ref="r0"),
        ids[1]: Outcome.retry("BROKER_5XX", "later", delay_s=3600),
        ids[2]: Outcome.dead("BAD_REQUEST", "no"),
        ids[3]: Outcome.sent(ref="r3"),
    }
    report = Relay(url, table_settings("outbox_events"), ScriptedDestination(lambda m: outcomes[m.id])).run(once=True)
    assert (report.sent, report.retried, report.dead) == (2, 1, 1)
    found = {
        r["id"]: r
        for r in conn.execute("SELECT id, status, result_ref, last_error_code, locked_by FROM outbox_events").fetchall()
    }
    assert [found[i]["status"] for i in ids] == ["sent", "pending", "dead", "sent"]
    assert found[ids[3]]["result_ref"] == "r3" and found[ids[2]]["last_error_code"] == "BAD_REQUEST"
    assert all(r["locked_by"] is None for r in found.values())
    # A table that deletes on success; one claimed in the relay's transaction; one that dedups.
    enqueue_n(conn, "outbox_members", 3)
    assert Relay(url, table_settings("outbox_members"), ScriptedDestination()).run(once=True).sent == 3
    assert _value(conn, "SELECT count(*) FROM outbox_members") == 0
    create_table(granted, "hrm_outbox")
    roles.grant_roles(granted)
    held = enqueue_n(conn, "hrm_outbox", 3)
    report = Relay(
        url,
        table_settings("hrm_outbox", claim="transaction"),
        ScriptedDestination(
            lambda m: Outcome.retry("BROKER_5XX", "later", delay_s=3600) if m.id == held[0] else Outcome.sent()
        ),
    ).run(once=True)
    assert (report.sent, report.retried) == (2, 1) and statuses(conn, "hrm_outbox") == {"sent": 2, "pending": 1}
    enqueue_n(conn, "outbox_memory", 2, payload=lambda i: {"same": True})
    assert Relay(url, table_settings("outbox_memory"), ScriptedDestination()).run(once=True).dedup_hits == 1
    # The order broker records each order's outcome in the ledger, in the settle's transaction.
    for i in range(3):
        assert accept_order(conn, "", order_payload(i)).kind == "accepted"
    report = Relay(url, table_settings(ORDERS_TABLE), _OrdersOneRejected()).run(once=True)
    assert (report.sent, report.dead) == (2, 1)
    ledger = {
        r["idempotency_key"]: r["status"]
        for r in conn.execute("SELECT idempotency_key, status FROM idempo_ledger").fetchall()
    }
    assert ledger == {"key-0": "succeeded", "key-1": "failed", "key-2": "succeeded"}


# The message itself, and what identifies it: no relay rewrites them.
MESSAGE_COLUMNS = ("payload", "payload_sha", "topic", "event_id", "headers", "tenant_id", "created_at")
# What identifies an order's ledger row and its request: the relay records outcomes, nothing else.
LEDGER_REQUEST_COLUMNS = ("idempotency_key", "scope", "request_digest", "event_id", "created_at", "expires_at")


def test_relay_role_cannot_rewrite_a_message_or_a_ledger_request(login_as: LoginAs, conn: DictConnection) -> None:
    [row_id] = enqueue_n(conn, "outbox_events", 1)
    accept_order(conn, "", order_payload(1))
    for role in (roles.RELAY, roles.MAINTAINER):
        url = login_as(role)
        for table in ("outbox_events", ORDERS_TABLE):
            for column in MESSAGE_COLUMNS:
                assert _denied(url, f"UPDATE {table} SET {column} = {column} WHERE id = %s", (row_id,)), (
                    role,
                    table,
                    column,
                )
        assert _denied(url, "UPDATE outbox_events SET payload = '{\"n\": 666}'")
        for column in LEDGER_REQUEST_COLUMNS:
            assert _denied(url, f"UPDATE idempo_ledger SET {column} = {column}"), (role, column)
        # Its outcome columns stay writable: what the order broker's settle writes.
        assert not _denied(
            url,
            "UPDATE idempo_ledger SET status = status, response = response, "
            "result = result, result_digest = result_digest, http_status = http_status, "
            "reason = reason, updated_at = updated_at",
        )
    assert _value(conn, "SELECT payload->>'n' FROM outbox_events") == "0"


def test_relay_delivers_with_its_heartbeat_and_audit_but_cannot_enqueue_or_clean(
    login_as: LoginAs, conn: DictConnection
) -> None:
    enqueue_n(conn, "outbox_events", 5)
    url = login_as(roles.RELAY)
    report = Relay(url, table_settings("outbox_events", batch_size=2), PaperBroker()).run(once=True)
    assert report.sent == 5
    assert _value(conn, "SELECT count(*) FROM outbox_events WHERE status = 'sent'") == 5
    assert _value(conn, "SELECT stopped_at IS NOT NULL FROM outbox_relay_workers") is True
    assert _value(conn, "SELECT count(*) FROM outbox_audit WHERE code = 'outbox_flush_success'") == 5
    # claim = "auto": it noted each batch it held on its worker row
    assert _value(conn, "SELECT cardinality(held_from) FROM outbox_relay_workers") == 1
    assert _denied(url, INSERT_EVENT)
    assert _denied(url, "DELETE FROM outbox_audit")
    assert _denied(url, "DELETE FROM idempo_ledger")
    assert _denied(url, "SELECT 1 FROM outbox_api_secret")
    assert _denied(url, "INSERT INTO outbox_alert_state (alert_key, severity) VALUES ('k', 'ok')")


def test_reader_reads_status_through_the_cli_but_cannot_write(
    login_as: LoginAs, conn: DictConnection, cli_env: dict[str, str]
) -> None:
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
    make_sent(conn, "outbox_events", ids[:2], age=timedelta(days=30))
    make_dead(conn, "outbox_events", ids[2:], code="BROKER_5XX")
    conn.execute(
        "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) "
        "VALUES ('old', 'd', now() - interval '1 hour')"
    )
    url = login_as(roles.MAINTAINER)
    assert clean(url, table_settings("outbox_events"), retention_s=timedelta(days=7).total_seconds()).deleted_sent == 2
    shared = clean_shared(url, audit_retention_s=3600.0)
    assert shared.deleted_expired == {"idempo_ledger": 1}
    # The Dagster code location's on-call sensor: two dead letters fire an alert, remembered.
    report = sweep(url, load_settings(env={}, path=None))
    assert not report.problems and report.alerts
    assert _value(conn, "SELECT count(*) > 0 FROM outbox_alert_state") is True
    assert replay_dead(url, "outbox_events", ReplayFilter(error_code="BROKER_5XX")).replayed == 2
    assert _denied(url, INSERT_EVENT)
    assert _denied(url, "SELECT 1 FROM outbox_api_secret")
    assert _denied(url, "TRUNCATE outbox_events")


def test_order_api_accepts_an_order_but_cannot_delete(login_as: LoginAs, conn: DictConnection) -> None:
    url = login_as(ORDER_API)
    assert migrate.pending(url) == []
    with psycopg.connect(url) as api:
        assert accept_order(api, "", order_payload(1)).kind == "accepted"
        api.commit()
        assert accept_order(api, "", order_payload(1)).kind == "replay"
        api.execute(
            "INSERT INTO outbox_api_secret (secret) VALUES (%s) ON CONFLICT (id) DO NOTHING", (secrets.token_hex(32),)
        )
        assert api.execute("SELECT secret FROM outbox_api_secret WHERE id").fetchone() is not None
        api.commit()
    assert _value(conn, f"SELECT count(*) FROM {ORDERS_TABLE}") == 1
    assert _denied(url, "DELETE FROM idempo_ledger")
    assert _denied(url, f"DELETE FROM {ORDERS_TABLE}")
    assert _denied(url, f"UPDATE {ORDERS_TABLE} SET status = 'sent'")
    assert _denied(url, "UPDATE idempo_ledger SET status = 'succeeded'")
    assert _denied(url, INSERT_EVENT)
    for column, value in FORGED_DELIVERY.items():  # an order's delivery is the relay's to write
        assert _denied(
            url,
            f"INSERT INTO {ORDERS_TABLE} (event_id, topic, payload, payload_sha, {column}) "
            f"VALUES ('forged-{column}', 't', '{{}}', 's', {value})",
        ), column


def test_order_api_role_starts_on_a_migrated_database(login_as: LoginAs) -> None:
    # What `outbox-pipelines order-api` runs as it starts: nothing is left to apply.
    assert migrate.upgrade(login_as(ORDER_API)) == []


def test_grant_is_idempotent_and_a_rerun_reaches_a_new_table(
    granted: str, conn: DictConnection, login_as: LoginAs
) -> None:
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
    db_url: str, conn: DictConnection, cli_env: dict[str, str]
) -> None:
    before = _table_acls(conn)
    result = run_cli(cli_env, "db", "grant", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert (
        'GRANT INSERT ("event_id", "tenant_id", "topic", "payload", "payload_sha", "headers", '
        '"available_at", "ordering_key") ON TABLE "outbox_events" TO "outbox_producer";'
    ) in result.stdout
    assert (
        'GRANT SELECT ("id", "event_id", "payload_sha") ON TABLE "outbox_events" TO "outbox_producer";' in result.stdout
    )
    assert 'ON SEQUENCE "public"."outbox_events_id_seq" TO "outbox_producer"' not in result.stdout  # no id to choose
    assert 'ON TABLE "outbox_orders" TO "outbox_producer"' not in result.stdout
    assert (
        'GRANT UPDATE ("status", "attempts", "available_at", "locked_by", "locked_at", "lease_expires_at", '
        '"last_error", "last_error_code", "result_ref", "published_at", "updated_at", "ordering_blocked", '
        '"ordering_skipped_at") '
        'ON TABLE "outbox_events" TO "outbox_relay";'
    ) in result.stdout
    assert "dry run: nothing changed" in result.stdout
    assert _table_acls(conn) == before
    result = run_cli(cli_env, "db", "grant")
    assert result.returncode == 0, result.stderr
    assert "outbox_producer" in result.stdout and "again after 'db create-table'" in result.stdout
    assert _table_acls(conn) != before


def test_cli_db_grant_refuses_a_role_that_does_not_own_the_tables(
    login_as: LoginAs, conn: DictConnection, cli_env: dict[str, str]
) -> None:
    before = _table_acls(conn)
    result = run_cli({**cli_env, "OUTBOX_DATABASE_URL": login_as(roles.MAINTAINER)}, "db", "grant")
    assert result.returncode == 1
    assert "does not own schema public, " in result.stderr and "run 'outbox-pipelines db grant' as" in result.stderr
    assert _table_acls(conn) == before


def test_the_wing_keeps_the_producer_off_its_table_and_the_engine_roles_gain_only_its_rights() -> None:
    by_name = {spec.name: spec for spec in roles.all_roles()}
    producer = by_name[roles.PRODUCER].grants[0]
    assert producer.table == roles.EVERY_OUTBOX_TABLE and ORDERS_TABLE in producer.except_tables
    assert {grant.table for grant in by_name[ORDER_API].grants} >= {ORDERS_TABLE, "idempo_ledger"}
    engine_only = {spec.name: spec for spec in roles.ENGINE_ROLES}
    assert all(ORDERS_TABLE not in grant.except_tables for grant in engine_only[roles.PRODUCER].grants)


def _declared(spec: roles.RoleSpec, outbox_tables: list[str]) -> set[tuple[str, str, str]]:
    """(table, privilege, column) of every column right the role is declared to hold; column '*' for DELETE."""
    held = set()
    for grant in spec.grants:
        for table in grant.tables_among(outbox_tables):
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
                columns = grant.columns_of(privilege)
                held |= {(table, privilege, column) for column in (columns or ())}
                if columns is None:
                    held.add((table, privilege, "*"))
    return held


def test_the_maintainer_holds_every_right_of_the_relay() -> None:
    by_name = {spec.name: spec for spec in roles.all_roles()}
    tables = ["outbox_events", ORDERS_TABLE]
    assert _declared(by_name[roles.RELAY], tables) <= _declared(by_name[roles.MAINTAINER], tables)


def test_each_role_holds_in_the_database_exactly_what_it_is_declared_to(granted: str, conn: DictConnection) -> None:
    plan = roles.plan_grants(conn)
    columns = conn.execute(
        "SELECT c.relname AS table_name, a.attname AS column_name "
        "FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid "
        "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' "
        "AND a.attnum > 0 AND NOT a.attisdropped"
    ).fetchall()
    for spec in roles.all_roles():
        declared = _declared(spec, plan.outbox_tables)
        wanted = {(t, p, c) for t, p, c in declared if c != "*"} | {
            (row["table_name"], p, row["column_name"])
            for row in columns
            for t, p, c in declared
            if c == "*" and t == row["table_name"] and p != "DELETE"
        }
        held = set()
        for row in columns:
            for privilege in ("SELECT", "INSERT", "UPDATE"):
                if _value(
                    conn,
                    "SELECT has_column_privilege(%s, quote_ident(%s), %s, %s)",
                    (spec.name, row["table_name"], row["column_name"], privilege),
                ):
                    held.add((row["table_name"], privilege, row["column_name"]))
        assert held == wanted, spec.name
        deletes = {t for t, p, _ in declared if p == "DELETE"}
        for table in {row["table_name"] for row in columns}:
            assert _value(conn, "SELECT has_table_privilege(%s, quote_ident(%s), 'DELETE')", (spec.name, table)) is (
                table in deletes
            ), (spec.name, table)
        usage = {t for g in spec.grants if g.id_sequence for t in g.tables_among(plan.outbox_tables)}
        for table in plan.outbox_tables:
            assert _value(
                conn,
                "SELECT has_sequence_privilege(%s, pg_get_serial_sequence(quote_ident(%s), 'id'), 'USAGE')",
                (spec.name, table),
            ) is (table in usage), (spec.name, table)


def test_the_printed_rights_say_which_columns() -> None:
    by_name = {spec.name: spec for spec in roles.all_roles()}
    assert roles.rights(by_name[roles.PRODUCER]) == [
        "INSERT (event_id, tenant_id, topic, payload, payload_sha, headers, available_at, ordering_key), "
        "SELECT (id, event_id, payload_sha) on every outbox table except outbox_orders",
        "SELECT, INSERT on every inbox table",
    ]
    relay = roles.rights(by_name[roles.RELAY])
    assert relay[0] == (
        "SELECT, DELETE, UPDATE (status, attempts, available_at, locked_by, locked_at, "
        "lease_expires_at, last_error, last_error_code, result_ref, published_at, updated_at, "
        "ordering_blocked, ordering_skipped_at) "
        "on every outbox table"
    )
    assert (
        "SELECT, UPDATE (status, result, result_digest, response, http_status, reason, updated_at) "
        "on idempo_ledger" in relay
    )
    assert roles.rights(by_name[ORDER_API])[0] == (
        "SELECT, INSERT (event_id, tenant_id, topic, payload, payload_sha, headers, available_at) on outbox_orders"
    )


def test_a_grant_refuses_rights_it_cannot_mean() -> None:
    with pytest.raises(ValueError, match="cannot be granted on columns"):
        roles.OnColumns("DELETE", ("status",))
    with pytest.raises(ValueError, match="granted twice"):
        roles.Grant("t", ("UPDATE",), (roles.OnColumns("UPDATE", ("status",)),))
    with pytest.raises(ValueError, match="only narrows"):
        roles.Grant("t", ("SELECT",), except_tables=("u",))


def test_db_grant_tells_the_tables_owner_without_schema_public_the_statement_that_gives_it(pg_server) -> None:
    """PostgreSQL 14's layout (deploy.md): the database's owner ran ``db upgrade`` and owns every table, but not its
    schema ``public``. ``db grant`` refuses with the statement a superuser runs once, and passes after it."""
    tag = f"g{os.getpid()}_{uuid.uuid4().hex[:6]}"
    owner, holder, password = f"{tag}_owner", f"{tag}_holder", secrets.token_hex(12)
    database = f"{tag}_db"
    params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(pg_server.admin_url).items() if v is not None}
    as_owner = psycopg.conninfo.make_conninfo(**{**params, "dbname": database, "user": owner, "password": password})
    as_admin = psycopg.conninfo.make_conninfo(**{**params, "dbname": database})
    with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(sql.Identifier(owner), password))
        admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(holder)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(owner)))
    try:
        migrate.upgrade(as_owner, parts=())
        with psycopg.connect(as_admin, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(holder)))
        with pytest.raises(roles.GrantRefused) as refused:
            roles.grant_roles(as_owner)
        told = str(refused.value)
        assert "owns the outbox tables but not schema public" in told
        statement = f'ALTER SCHEMA "public" OWNER TO "{owner}"'
        assert statement in told and password not in told
        with psycopg.connect(as_admin, autocommit=True) as admin:
            admin.execute(statement)  # as told
        roles.grant_roles(as_owner)
    finally:
        with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
            for name in (owner, holder):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
