"""Migration 0023: the payload-limit and NOTIFY triggers every INSERT runs, with fewer PL/pgSQL steps. A database of the
version before gets them with each table's limit kept, without a table lock; the limit, the refusal's words and
json_bytes are what they were, at the limit's edges too; the relay's notification still comes at commit."""

import json

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core.storage import migrate
from outbox_pipelines_tests.core.earlier_versions import upgrade_beside_a_writer, upgrade_to_before

LIMITED, UNLIMITED, BORROWING = "limited_outbox", "unlimited_outbox", "borrowing_outbox"


def _function_source(conn, table):
    """The source of ``table``'s payload-limit function, its own names written as <table> and <fn>."""
    fn = conn.execute("SELECT outbox_ordering_function('payload_limit', %s) AS fn", (table,)).fetchone()["fn"]
    source = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure(quote_ident(%s) || '()')", (fn,)
    ).fetchone()["prosrc"]
    return source.replace(fn, "<fn>").replace(table, "<table>")


def _limit(conn, table):
    return conn.execute("SELECT outbox_payload_limit_of(%s) AS n", (table,)).fetchone()["n"]


def _insert(conn, table, event_id, payload_text, headers_text="{}"):
    conn.execute(
        f"INSERT INTO {table} (event_id, topic, payload, payload_sha, headers) "
        "VALUES (%s, 't', %s::jsonb, 's', %s::jsonb)",
        (event_id, payload_text, headers_text),
    )


def _text_of(size):
    """A JSON object whose text, as PostgreSQL writes it, is ``size`` bytes."""
    text = json.dumps({"b": "x" * (size - 9)})
    assert len(text) == size
    return text


@pytest.fixture
def migrated_from_0022(empty_db, tmp_path):
    """A database of the version before 0023, with a table limited to 1,000 bytes and one without a limit."""
    upgrade_to_before(empty_db, tmp_path, "0023")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(f"SELECT outbox_create_table('{LIMITED}'), outbox_create_table('{UNLIMITED}')")
        # A copy whose trigger calls another table's function (as bench/enqueue_vs_insert.py makes): not its own.
        conn.execute(f"CREATE TABLE {BORROWING} (LIKE {LIMITED} INCLUDING ALL)")
        fn = conn.execute("SELECT outbox_ordering_function('payload_limit', %s)", (LIMITED,)).fetchone()[0]
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER outbox_payload_limit BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
            ).format(sql.Identifier(BORROWING), sql.Identifier(fn))
        )
        conn.execute(
            f"SELECT outbox_set_payload_limit('{LIMITED}', 1000), outbox_set_payload_limit('{UNLIMITED}', NULL)"
        )
    return empty_db


def test_a_database_of_the_version_before_gets_the_functions_a_new_table_gets_with_its_limits(migrated_from_0022):
    url = migrated_from_0022
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        before = _function_source(conn, LIMITED)
        notify_before = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'outbox_notify_insert'").fetchone()
        # A transaction writing into the table all along: replacing functions waits for no lock of it.
        applied = upgrade_beside_a_writer(url, lambda holder: _insert(holder, LIMITED, "held", "{}"))
        assert [name for name in applied if name.startswith("0023")] == ["0023_insert_triggers_lean.sql"]
        assert (_limit(conn, LIMITED), _limit(conn, UNLIMITED)) == (1000, None)
        # Each table's function is now the one outbox_set_payload_limit writes for a new table of the same limit.
        conn.execute("SELECT outbox_create_table('fresh_limited'), outbox_create_table('fresh_unlimited')")
        conn.execute(
            "SELECT outbox_set_payload_limit('fresh_limited', 1000), outbox_set_payload_limit('fresh_unlimited', NULL)"
        )
        assert _function_source(conn, LIMITED) == _function_source(conn, "fresh_limited") != before
        assert _function_source(conn, UNLIMITED) == _function_source(conn, "fresh_unlimited")
        # The copy's trigger calls the limited table's function, now the new one; no function of its own was made.
        assert conn.execute(
            "SELECT to_regprocedure(quote_ident(outbox_ordering_function('payload_limit', %s)) || '()') AS fn",
            (BORROWING,),
        ).fetchone() == {"fn": None}
        with pytest.raises(
            psycopg.errors.CheckViolation, match=f"over the limit of 1000 bytes of outbox table {LIMITED}"
        ):
            _insert(conn, BORROWING, "too-big", _text_of(1001))
        assert "PERFORM" in notify_before["prosrc"]
        assert (
            "PERFORM"
            not in conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'outbox_notify_insert'").fetchone()[
                "prosrc"
            ]
        )


def test_the_limit_its_words_and_json_bytes_at_its_edges(migrated_from_0022):
    """One comparison of the sum on the way in: a row whose parts each fit is kept even when the sum is over."""
    url = migrated_from_0022
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _insert(conn, LIMITED, "both-at-the-limit", _text_of(1000), _text_of(1000))
        _insert(conn, LIMITED, "small", '{"n": 1}', '{"h": "v"}')
        for event_id, payload, headers, what, size in [
            ("payload-over", _text_of(1001), "{}", "payload", 1001),
            ("headers-over", _text_of(10), _text_of(1001), "headers", 1001),
            ("both-over", _text_of(1500), _text_of(1200), "payload", 1500),
        ]:
            with pytest.raises(psycopg.errors.CheckViolation) as raised:
                _insert(conn, LIMITED, event_id, payload, headers)
            assert raised.value.diag.constraint_name == "outbox_payload_max_1000_bytes"
            assert f"{what} of {size} bytes over the limit of 1000 bytes of outbox table {LIMITED}" in str(raised.value)
        _insert(conn, UNLIMITED, "big", _text_of(5000), _text_of(3000))
        sizes = conn.execute(
            f"SELECT event_id, json_bytes FROM {LIMITED} UNION ALL SELECT event_id, json_bytes FROM {UNLIMITED} "
            "ORDER BY event_id"
        ).fetchall()
        assert [(r["event_id"], r["json_bytes"]) for r in sizes] == [
            ("big", 8000),
            ("both-at-the-limit", 2000),
            ("small", len('{"n": 1}') + len('{"h": "v"}')),
        ]


def test_a_relay_listening_is_told_at_commit_whoever_writes_and_whatever_its_search_path(migrated_from_0022):
    url = migrated_from_0022
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url) as writer:
        listener.execute(f'LISTEN "outbox:{LIMITED}"')
        writer.execute("CREATE SCHEMA shadow")
        writer.execute("CREATE FUNCTION shadow.pg_notify(text, text) RETURNS void LANGUAGE sql AS 'SELECT'")
        writer.execute("SET search_path = shadow, public, pg_catalog")
        _insert(writer, LIMITED, "n-1", "{}")
        _insert(writer, LIMITED, "n-2", "{}")
        assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # nothing before the commit
        writer.commit()
        told = list(listener.notifies(timeout=5, stop_after=1))
        assert [(n.channel, n.payload) for n in told] == [(f"outbox:{LIMITED}", "")]
