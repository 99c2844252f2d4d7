"""The payload limit held by the database too (issue 42, migration 0020): a producer writing an outbox table by SQL
meets OUTBOX_MAX_PAYLOAD_BYTES as enqueue does; enqueue says the same sentence whichever of the two refuses; `db
upgrade` sizes each table's limit from the setting, and the rows stored before are not judged again."""

import asyncio
import json
import os
import re
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import InvalidMessage
from outbox_pipelines.core.operations import upgrade
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage import migrate, payload_limit, roles, schema
from outbox_pipelines.core.storage.migration_safety import LockWaits
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.core.earlier_versions import upgrade_to_before

EVENTS = "outbox_events"
PASSWORD = uuid.uuid4().hex  # for a server that checks passwords (OUTBOX_TEST_DATABASE_URL)


def limit(conn, table=EVENTS):
    """The limit the table's trigger holds (None: none), or "no trigger"."""
    row = conn.execute(
        "SELECT outbox_payload_limit_of(%(t)s) AS max_bytes, outbox_payload_limit_set(%(t)s) AS has", {"t": table}
    ).fetchone()
    return row["max_bytes"] if row["has"] else "no trigger"


def refused(raised, max_bytes, what="payload", table=EVENTS):
    """The database's refusal: check_violation naming the constraint of the limit, and a sentence saying it."""
    assert raised.value.diag.constraint_name == f"outbox_payload_max_{max_bytes}_bytes"
    assert re.search(
        rf"{what} of \d+ bytes over the limit of {max_bytes} bytes of outbox table {table}", str(raised.value)
    )


def insert_sql(conn, payload_text, headers_text="{}", table=EVENTS, event_id="e"):
    """A producer bypassing the library: a plain INSERT of its own JSON text."""
    conn.execute(
        f"INSERT INTO {table} (event_id, topic, payload, payload_sha, headers) "
        "VALUES (%s, 't', %s::jsonb, 's', %s::jsonb)",
        (event_id, payload_text, headers_text),
    )


def count(conn, table=EVENTS):
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def test_a_producer_writing_by_sql_over_the_limit_is_refused_by_the_database(db_url, conn):
    report = payload_limit.apply(db_url, [EVENTS], 1000)
    assert report.applied == [EVENTS]
    insert_sql(conn, json.dumps({"blob": "x" * 900}), '{"h": 1}', event_id="fits")
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        insert_sql(conn, json.dumps({"blob": "x" * 2000}), event_id="too-big")
    refused(raised, 1000)
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        insert_sql(conn, "{}", json.dumps({"h": "y" * 2000}), event_id="big-headers")
    refused(raised, 1000, "headers")
    # The database keeps each row's size, which the relay's claim reads, whatever the INSERT says.
    insert_sql(conn, '{"n": 1}', event_id="says-small")
    conn.execute(f"UPDATE {EVENTS} SET json_bytes = NULL")  # the owner may; no role of the package may (below)
    conn.execute(
        f"INSERT INTO {EVENTS} (event_id, topic, payload, payload_sha, json_bytes) VALUES ('lies', 't', %s, 's', 1)",
        (json.dumps({"blob": "x" * 900}),),
    )
    sizes = conn.execute(f"SELECT event_id, json_bytes FROM {EVENTS} WHERE json_bytes IS NOT NULL").fetchall()
    assert [(r["event_id"], r["json_bytes"]) for r in sizes] == [("lies", 912 + 2)]


def test_a_producer_login_writing_by_sql_is_refused_and_cannot_set_the_size(db_url, conn):
    """A real login of the producer role, writing by SQL: its over-limit payload is refused, the size it writes is not
    kept, and it may not change a stored row's size."""
    roles.grant_roles(db_url)
    payload_limit.apply(db_url, [EVENTS], 1000)
    producer = login(conn, roles.PRODUCER)
    try:
        with psycopg.connect(db_url, user=producer, password=PASSWORD, autocommit=True) as app:
            with pytest.raises(psycopg.errors.CheckViolation) as raised:
                insert_sql(app, json.dumps({"blob": "x" * 2000}), event_id="big")
            refused(raised, 1000)
            insert_sql(app, json.dumps({"blob": "x" * 900}), event_id="fits")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(f"UPDATE {EVENTS} SET json_bytes = 1")
        assert conn.execute(f"SELECT json_bytes FROM {EVENTS}").fetchone()["json_bytes"] == 912 + 2
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(producer)))


def login(conn, group):
    """A login role in ``group`` (a role of the package)."""
    name = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
            sql.Identifier(name), sql.Literal(PASSWORD), sql.Identifier(group)
        )
    )
    return name


def test_a_writer_cannot_shadow_what_the_check_calls(db_url, conn):
    """The check runs as the writer: its own octet_length and operators, first on its search_path, are not used."""
    payload_limit.apply(db_url, [EVENTS], 1000)
    conn.execute("CREATE SCHEMA shadow")
    conn.execute("CREATE FUNCTION shadow.octet_length(text) RETURNS integer LANGUAGE sql AS 'SELECT 0'")
    conn.execute("CREATE FUNCTION shadow.int4gt(integer, integer) RETURNS boolean LANGUAGE sql AS 'SELECT false'")
    conn.execute("SET search_path = shadow, public, pg_catalog")
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        insert_sql(conn, json.dumps({"blob": "x" * 2000}))
    refused(raised, 1000)


def test_the_database_measures_the_json_text_it_stores_not_the_size_on_disk(db_url, conn):
    """20 MiB of one letter compresses to a few kB on disk: the limit is on what a relay would read."""
    payload_limit.apply(db_url, [EVENTS], 1024 * 1024)
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        conn.execute(
            f"INSERT INTO {EVENTS} (event_id, topic, payload, payload_sha) "
            "VALUES ('big', 't', jsonb_build_object('blob', repeat('x', 20 * 1024 * 1024)), 's')"
        )
    refused(raised, 1024 * 1024)
    assert count(conn) == 0


def _enqueue_one(db_url, outbox, message):
    with psycopg.connect(db_url, autocommit=True) as conn:
        outbox.enqueue(conn, message, outside_transaction=True)


def _enqueue_batch(db_url, outbox, message, size):
    messages = [Message(topic=message.topic, payload={"n": n}, event_id=f"b-{n}") for n in range(size - 1)]
    messages.append(Message(topic=message.topic, payload=message.payload, event_id="b-big"))
    with psycopg.connect(db_url) as conn, conn.transaction():
        outbox.enqueue_many(conn, messages)


def _enqueue_async(db_url, outbox, message):
    async def run():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await outbox.enqueue_async(conn, message, outside_transaction=True)

    asyncio.run(run())


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda url, o, m: _enqueue_one(url, o, m), id="one"),
        pytest.param(lambda url, o, m: _enqueue_batch(url, o, m, 3), id="batch-insert"),
        pytest.param(lambda url, o, m: _enqueue_batch(url, o, m, 50), id="batch-copy"),
        pytest.param(lambda url, o, m: _enqueue_async(url, o, m), id="async"),
    ],
)
def test_enqueue_says_the_same_sentence_whether_the_library_or_the_database_refuses(db_url, conn, path):
    payload_limit.apply(db_url, [EVENTS], 1000)
    big = Message(topic="t", payload={"blob": "x" * 2000})
    # The library's own limit, the same number: it refuses before the database is asked.
    with pytest.raises(InvalidMessage, match="over the limit of 1000 bytes") as library:
        path(db_url, Outbox(EVENTS, max_payload_bytes=1000), big)
    # An application configured with a larger limit than the database's: the database refuses, same words.
    with pytest.raises(InvalidMessage, match="over the limit of 1000 bytes") as database:
        path(db_url, Outbox(EVENTS, max_payload_bytes=10_000), big)
    assert "OUTBOX_MAX_PAYLOAD_BYTES" in str(library.value) and "OUTBOX_MAX_PAYLOAD_BYTES" in str(database.value)
    assert f"outbox table {EVENTS!r}" in str(database.value)
    assert count(conn) == 0


def test_a_copy_refused_by_the_database_leaves_the_callers_transaction_usable(db_url):
    payload_limit.apply(db_url, [EVENTS], 1000)
    messages = [Message(topic="t", payload={"n": n}) for n in range(40)]
    messages.append(Message(topic="t", payload={"b": "x" * 2000}))
    with psycopg.connect(db_url) as conn:
        with conn.transaction():
            with pytest.raises(InvalidMessage, match="over the limit of 1000 bytes"):
                Outbox(EVENTS, max_payload_bytes=10_000).enqueue_many(conn, messages)
            Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={"after": 1}))
        assert conn.execute(f"SELECT count(*) FROM {EVENTS}").fetchone()[0] == 1


def test_new_tables_get_the_default_limit_from_outbox_create_table(db_url, conn):
    assert schema.create_table(db_url, "fresh_outbox")
    assert limit(conn, "fresh_outbox") == 1024 * 1024
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        insert_sql(conn, json.dumps({"blob": "x" * (1024 * 1024)}), table="fresh_outbox")
    refused(raised, 1024 * 1024, table="fresh_outbox")


def test_db_upgrade_sizes_the_constraint_from_the_setting_and_resizes_it(db_url, conn, monkeypatch):
    settings = load_settings(env={}, path=None)
    monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "4096")
    first = upgrade.upgrade_project(db_url, settings)
    assert first.payload_limit is not None and EVENTS in first.payload_limit.applied
    assert limit(conn) == 4096
    # A row of 3 kB is stored; the limit is lowered: the row stays (never re-judged), new ones are refused.
    insert_sql(conn, json.dumps({"blob": "x" * 3000}), event_id="stored-before")
    monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "2048")
    assert "SELECT outbox_set_payload_limit('outbox_events', 2048);" in upgrade.plan_project(db_url, settings).limits
    second = upgrade.upgrade_project(db_url, settings)
    assert second.payload_limit is not None and EVENTS in second.payload_limit.applied
    assert limit(conn) == 2048
    assert count(conn) == 1
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        insert_sql(conn, json.dumps({"blob": "x" * 3000}), event_id="after")
    refused(raised, 2048)
    # The same size again: nothing is altered.
    third = upgrade.upgrade_project(db_url, settings)
    assert third.payload_limit is not None and third.payload_limit.applied == []
    assert EVENTS in third.payload_limit.unchanged
    assert upgrade.plan_project(db_url, settings).limits == []


def test_the_cli_sizes_the_limit_at_db_upgrade_and_db_create_table(cli_env, conn):
    env = {**cli_env, "OUTBOX_MAX_PAYLOAD_BYTES": "5000"}
    done = run_cli(env, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    assert "payload limit of 5000 bytes (OUTBOX_MAX_PAYLOAD_BYTES) on:" in done.stdout
    assert limit(conn) == 5000
    created = run_cli(env, "db", "create-table", "hrm_outbox")
    assert created.returncode == 0, created.stderr
    assert limit(conn, "hrm_outbox") == 5000


def test_changing_the_limit_takes_no_lock_on_the_table(db_url, conn):
    """Only the table's trigger function is replaced: done while a transaction holds the table."""
    holder = psycopg.connect(db_url)
    try:
        holder.execute(
            f"INSERT INTO {EVENTS} (event_id, topic, payload, payload_sha) VALUES ('held', 't', '{{}}', 's')"
        )
        started = time.monotonic()
        assert payload_limit.apply(
            db_url, [EVENTS], 2000, LockWaits(lock_timeout_s=0.2, give_up_after_s=1)
        ).applied == [EVENTS]
        assert time.monotonic() - started < 1.0
    finally:
        holder.rollback()
        holder.close()
    assert limit(conn) == 2000


def test_adding_the_trigger_gives_way_to_the_application(db_url, conn):
    """A table without the trigger (made before 0020): adding it takes the table's lock for a moment; behind an open
    transaction it gives up after the lock timeout (the writers queued behind it go on), tries again, and leaves the
    table as it was, saying who held it, when it gives up."""
    conn.execute(f"DROP TRIGGER outbox_payload_limit ON {EVENTS}")
    holder = psycopg.connect(db_url)
    holder.execute(f"INSERT INTO {EVENTS} (event_id, topic, payload, payload_sha) VALUES ('held', 't', '{{}}', 's')")
    waits = LockWaits(lock_timeout_s=0.2, give_up_after_s=1.5)
    reports: list[payload_limit.PayloadLimitReport] = []
    resizing = threading.Thread(target=lambda: reports.append(payload_limit.apply(db_url, [EVENTS], 2000, waits)))
    resizing.start()
    longest = 0.0
    try:
        while resizing.is_alive():
            started = time.monotonic()
            insert_sql(conn, "{}", event_id=f"w-{started}")
            longest = max(longest, time.monotonic() - started)
            time.sleep(0.02)
    finally:
        resizing.join()
        holder.rollback()
        holder.close()
    assert reports[0].applied == [] and "could not take its locks" in reports[0].skipped[EVENTS]
    assert "pid" in reports[0].skipped[EVENTS]  # who held it
    assert longest < 1.0, f"a writer waited {longest:.2f} s behind the resize"
    assert limit(conn) == "no trigger"
    assert payload_limit.apply(db_url, [EVENTS], 2000).applied == [EVENTS]
    assert limit(conn) == 2000


def test_the_migration_gives_the_tables_that_exist_the_size_db_upgrade_runs_with(empty_db, tmp_path):
    """0020 on a database of the previous version: each outbox table gets the limit of the upgrading project at once
    (no moment under a smaller one), except a table another project owns: its rows' size is kept, its limit is left to
    that project's upgrade."""
    upgrade_to_before(empty_db, tmp_path, "0020")
    with psycopg.connect(empty_db, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        conn.execute(
            "SELECT outbox_create_table('ours'), outbox_create_table('theirs'), outbox_create_table('nobodys')"
        )
        conn.execute("INSERT INTO outbox_table_owners (outbox_table, project) VALUES ('ours', 'p'), ('theirs', 'q')")
        sized = payload_limit.migration_settings(4_194_304, "p")
        (step,) = [m for m in migrate.pending_migrations(empty_db) if m.version == "0020"]
        planned = migrate.concrete_steps(empty_db, [step], sized)["0020"]
        assert "SELECT outbox_set_payload_limit('ours', 4194304);" in planned
        assert "SELECT outbox_set_payload_limit('theirs', NULL);" in planned  # its size, no limit: its project's
        migrate.upgrade(empty_db, settings=sized)
        assert (limit(conn, "ours"), limit(conn, "nobodys"), limit(conn, "theirs")) == (4_194_304, 4_194_304, None)
