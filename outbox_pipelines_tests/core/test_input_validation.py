"""Bad input fails early (issue 9): InvalidMessage or exit 2 with a message naming the problem, nothing written."""

import json
from datetime import timedelta

import pytest

from outbox_pipelines import InvalidMessage, InvalidTableName, Message, Outbox
from outbox_pipelines.core.canonical import MAX_NESTING_DEPTH, checked_canonical_payload
from outbox_pipelines.core.errors import RetentionTooShort
from outbox_pipelines.core.names import reserved_table_names
from outbox_pipelines.core.operations.maintenance import MIN_RETENTION_S, clean, minimum_retention_s
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.rows import make_sent

EVENTS = "outbox_events"


def count(conn, table=EVENTS):
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


# -- control characters in identifiers and headers ---------------------------
BAD_TEXT = ["a\r\nb", "line\n", "tab\there", "nul\x00", "esc\x1b[31m", "del\x7f", "c1\x85", "lone\ud800"]


def _message(field: str, value: str) -> Message:
    base = {"topic": "org.changed", "payload": {"org_id": 1}, "event_id": "e-1", "tenant_id": None, "headers": {}}
    if field == "trace_id":
        base["headers"] = {"trace_id": value}
    elif field == "header name":
        base["headers"] = {value: "x"}
    else:
        base[field] = value
    return Message(**base)


@pytest.mark.parametrize("value", BAD_TEXT, ids=repr)
@pytest.mark.parametrize("field", ["topic", "event_id", "tenant_id", "trace_id", "header name"])
def test_control_characters_are_refused_naming_the_field(conn, field, value):
    with pytest.raises(InvalidMessage) as caught:
        Outbox(EVENTS).enqueue(conn, _message(field, value), outside_transaction=True)
    text = str(caught.value)
    assert field in text
    assert "U+" in text and ("control character" in text or "lone surrogate" in text)
    assert value not in text  # the message describes the character, it does not echo it raw
    assert count(conn) == 0


def test_control_characters_in_a_batch_write_nothing(conn):
    good = Message(topic="t", payload={}, event_id="good-1")
    bad = Message(topic="t", payload={}, event_id="bad\n2")
    with pytest.raises(InvalidMessage, match="event_id contains a control character"):
        Outbox(EVENTS).enqueue_many(conn, [good, bad], outside_transaction=True)
    assert count(conn) == 0


def test_nested_header_text_is_checked_and_printable_text_is_accepted(conn):
    with pytest.raises(InvalidMessage, match=r"header 'baggage'\[1\]"):
        Outbox(EVENTS).enqueue(
            conn, Message(topic="t", payload={}, headers={"baggage": ["ok", "x\r\ny"]}), outside_transaction=True
        )
    fine = Message(
        topic="org.changed/ü ✓",
        payload={"text": "multi\nline is fine in a payload"},
        event_id="ключ-1",
        tenant_id="acme corp",
        headers={"trace_id": "00-abc-01", "n": 3},
    )
    Outbox(EVENTS).enqueue(conn, fine, outside_transaction=True)
    assert rows(conn, EVENTS)[0]["payload"] == {"text": "multi\nline is fine in a payload"}


@pytest.mark.parametrize(
    "flag, value, field",
    [
        ("--topic", "org.changed\r\nX-Evil: 1", "topic"),
        ("--event-id", "e\n1", "event_id"),
        ("--tenant", "acme\x07", "tenant_id"),  # (argv cannot carry NUL)
        ("--trace-id", "tr\r\n", "trace_id"),
    ],
)
def test_cli_enqueue_refuses_control_characters(cli_env, conn, flag, value, field):
    args = {"--topic": "org.changed", "--event-id": "cli-ctl-1"}
    args[flag] = value
    flat = [item for pair in args.items() for item in pair]
    result = run_cli(cli_env, "enqueue", "--table", EVENTS, "--payload", '{"org_id": 1}', *flat)
    assert result.returncode == 2, result.stderr
    assert field in result.stderr and "control character" in result.stderr
    assert "Traceback" not in result.stderr
    assert statuses(conn, EVENTS) == {}


# -- enqueue_many with an event_id repeated in the same call ------------------
def test_enqueue_many_repeated_event_id_same_payload(conn):
    results = Outbox(EVENTS).enqueue_many(
        conn,
        [
            Message(topic="t", payload={"n": 1}, event_id="twin"),
            Message(topic="t", payload={"n": 1}, event_id="twin"),
        ],
        outside_transaction=True,
    )
    assert [(r.duplicate, r.same_payload) for r in results] == [(False, True), (True, True)]
    assert results[0].id == results[1].id
    assert count(conn) == 1


def test_enqueue_many_repeated_event_id_different_payload_says_so(conn):
    results = Outbox(EVENTS).enqueue_many(
        conn,
        [
            Message(topic="t", payload={"n": 1}, event_id="twin"),
            Message(topic="t", payload={"n": 2}, event_id="other"),
            Message(topic="t", payload={"n": 999}, event_id="twin"),
            Message(topic="t", payload={"n": 1}, event_id="twin"),
        ],
        outside_transaction=True,
    )
    assert [(r.event_id, r.duplicate, r.same_payload) for r in results] == [
        ("twin", False, True),
        ("other", False, True),
        ("twin", True, False),
        ("twin", True, True),
    ]
    stored = {r["event_id"]: r["payload"] for r in rows(conn, EVENTS)}
    assert stored == {"twin": {"n": 1}, "other": {"n": 2}}  # the first occurrence is what was written


def test_enqueue_many_repeated_event_id_already_stored(conn):
    Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={"n": 1}, event_id="old"), outside_transaction=True)
    results = Outbox(EVENTS).enqueue_many(
        conn,
        [
            Message(topic="t", payload={"n": 2}, event_id="old"),
            Message(topic="t", payload={"n": 1}, event_id="old"),
        ],
        outside_transaction=True,
    )
    assert [(r.duplicate, r.same_payload) for r in results] == [(True, False), (True, True)]
    assert count(conn) == 1


# -- depth and keys of payloads ----------------------------------------------
def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_a_100000_deep_payload_is_invalid_not_a_recursion_error(conn):
    deep_list: list = []
    for _ in range(100_000):
        deep_list = [deep_list]
    for payload in (_nested(100_000), {"x": deep_list}, '{"a":' * 100_000 + "{}" + "}" * 100_000):
        with pytest.raises(InvalidMessage, match=f"deeper than {MAX_NESTING_DEPTH} levels"):
            Outbox(EVENTS).enqueue(conn, Message(topic="t", payload=payload), outside_transaction=True)
    assert count(conn) == 0


def test_nesting_up_to_the_cap_is_accepted(conn):
    Outbox(EVENTS).enqueue(conn, Message(topic="t", payload=_nested(MAX_NESTING_DEPTH)), outside_transaction=True)
    with pytest.raises(InvalidMessage, match=r"deeper than 100 levels .*at \$(\.a){100}"):
        Outbox(EVENTS).enqueue(
            conn, Message(topic="t", payload=_nested(MAX_NESTING_DEPTH + 1)), outside_transaction=True
        )
    with pytest.raises(InvalidMessage, match="headers nests deeper"):
        Outbox(EVENTS).enqueue(
            conn, Message(topic="t", payload={}, headers=_nested(MAX_NESTING_DEPTH + 1)), outside_transaction=True
        )
    assert count(conn) == 1


@pytest.mark.parametrize(
    "payload, where",
    [
        ({1: "one"}, r"key 1 at \$ is a int"),
        ({"a": {"b": [{2.5: "x"}]}}, r"key 2\.5 at \$\.a\.b\[0\] is a float"),
        ({"ok": 1, None: 2}, "key None at \\$ is a NoneType"),
        ({True: 1}, "key True at \\$ is a bool"),
    ],
)
def test_non_string_keys_are_refused_not_stringified(conn, payload, where):
    with pytest.raises(InvalidMessage, match=where):
        Outbox(EVENTS).enqueue(conn, Message(topic="t", payload=payload), outside_transaction=True)
    assert count(conn) == 0


def test_integer_keys_no_longer_collide_with_string_keys():
    # json.dumps({1: "a", "1": "b"}) would write the key "1" twice.
    with pytest.raises(InvalidMessage, match="not a string"):
        checked_canonical_payload({1: "a", "1": "b"})


# -- db create-table with a reserved or taken name ---------------------------
@pytest.mark.parametrize("name", ["outbox_audit", "idempo_ledger", "outbox_schema_migrations", "pg_class", "pg_mine"])
def test_create_table_refuses_reserved_names(cli_env, conn, name):
    result = run_cli(cli_env, "db", "create-table", name)
    assert result.returncode == 2, result.stderr
    assert f"{name!r} cannot be an outbox table" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(InvalidTableName):
        Outbox(name)


def test_create_table_refuses_an_existing_business_table(cli_env, conn):
    conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, amount numeric)")
    conn.execute("CREATE VIEW invoice_view AS SELECT * FROM invoices")
    for name, kind in (("invoices", "table"), ("invoice_view", "view")):
        result = run_cli(cli_env, "db", "create-table", name)
        assert result.returncode == 2, result.stderr
        assert f"already names a {kind}" in result.stderr and "not an outbox table" in result.stderr
    columns = [
        r["column_name"]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'invoices' ORDER BY ordinal_position"
        )
    ]
    assert columns == ["id", "amount"]  # untouched
    assert conn.execute("SELECT count(*) AS n FROM pg_indexes WHERE tablename = 'invoices'").fetchone()["n"] == 1


def test_create_table_still_creates_and_rechecks_outbox_tables(db_url, conn):
    assert create_table(db_url, "hrm_outbox") is True
    assert create_table(db_url, "hrm_outbox") is False
    assert create_table(db_url, "outbox_events") is False


def test_reserved_names_are_every_non_outbox_table_of_the_schema(conn):
    """The one list of reserved names matches what the migrations create (a new shared table must join it)."""
    tables = {
        r["relname"]
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'v', 'm') AND n.nspname = current_schema() "
            "AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'outbox_notify_insert')"
        )
    }
    assert tables <= reserved_table_names(), (
        f"add {sorted(tables - reserved_table_names())} to RESERVED_TABLE_NAMES or its wing's shared_tables"
    )


# -- clean: a retention shorter than the dedup horizon -------------------------
def _sent_long_ago(conn, n: int) -> list[int]:
    ids = enqueue_n(conn, EVENTS, n)
    t0 = db_now(conn)
    make_sent(conn, EVENTS, published_at=t0 - timedelta(minutes=10))
    return ids


def test_minimum_retention_is_the_dedup_horizon():
    generic, memory = table_settings(EVENTS), table_settings("outbox_memory")
    assert minimum_retention_s(generic) == MIN_RETENTION_S == 3600
    # memory: backoffs of 60 s .. 3600 s over 10 attempts, +30 % jitter, one lease each: over 5 h
    assert minimum_retention_s(memory) == pytest.approx(memory.retry.horizon_s() + 10 * memory.lease_s)
    assert minimum_retention_s(memory) > 5 * 3600


def test_clean_refuses_a_retention_below_the_dedup_horizon(db_url, conn):
    _sent_long_ago(conn, 3)
    with pytest.raises(RetentionTooShort, match="shorter than the dedup horizon of 60 min"):
        clean(db_url, table_settings(EVENTS), retention_s=0)
    with pytest.raises(RetentionTooShort):
        clean(db_url, table_settings(EVENTS, retention_s=60))  # a configured retention too
    assert statuses(conn, EVENTS) == {"sent": 3}
    assert clean(db_url, table_settings(EVENTS), retention_s=0, force=True).deleted_sent == 3


def test_cli_clean_retention_0_exits_2_unless_forced(cli_env, conn):
    _sent_long_ago(conn, 2)
    refused = run_cli(cli_env, "clean", "--table", EVENTS, "--retention", "0s")
    assert refused.returncode == 2, refused.stderr
    assert "dedup horizon" in refused.stderr and "--force" in refused.stderr and "delivered twice" in refused.stderr
    assert statuses(conn, EVENTS) == {"sent": 2}
    # one table over the limit refuses the whole command before anything is deleted
    mixed = run_cli(cli_env, "clean", "--table", EVENTS, "--table", "outbox_memory", "--retention", "2h")
    assert mixed.returncode == 2 and "outbox_memory" in mixed.stderr
    assert statuses(conn, EVENTS) == {"sent": 2}
    forced = run_cli(cli_env, "clean", "--table", EVENTS, "--retention", "0s", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "deleted 2 sent rows" in forced.stdout
    assert statuses(conn, EVENTS) == {}


def test_event_id_dedup_holds_while_sent_rows_are_kept(cli_env, conn):
    """What the minimum protects: re-enqueueing a delivered event_id is a duplicate, not a second delivery."""
    _sent_long_ago(conn, 1)
    event_id = rows(conn, EVENTS)[0]["event_id"]
    kept = run_cli(cli_env, "clean", "--table", EVENTS)  # the default retention (168h)
    assert kept.returncode == 0, kept.stderr
    again = run_cli(
        cli_env,
        "enqueue",
        "--table",
        EVENTS,
        "--topic",
        "t",
        "--payload",
        "{}",
        "--event-id",
        event_id,
        "--allow-unknown-topic",
        "--json",
    )
    assert json.loads(again.stdout)["duplicate"] is True
