"""What ``Inbox.receive`` refuses, each with one error that says what to do, and nothing recorded: an empty,
oversized or non-text message id or consumer, a table that is not a created inbox, a call outside a transaction, a
name that is not an identifier, an asyncio connection."""

import asyncio

import psycopg
import pytest

from outbox_pipelines import Inbox, InvalidMessage, InvalidTableName, NoTransaction, UnknownTable
from outbox_pipelines.core.models import MAX_INBOX_CONSUMER_CHARS, MAX_INBOX_MESSAGE_ID_CHARS

INBOX = Inbox("billing_inbox")


def _count(conn) -> int:
    return int(conn.execute("SELECT count(*) AS n FROM billing_inbox").fetchone()["n"])


@pytest.mark.parametrize(
    "message_id, consumer, said",
    [
        ("", "billing", "message_id must be a non-empty string of at most 255 characters (got 0)"),
        ("m" * (MAX_INBOX_MESSAGE_ID_CHARS + 1), "billing", "message_id must be a non-empty string of at most 255"),
        (b"m-1", "billing", "message_id must be a str, got bytes (decode a bytes header first)"),
        ("m-1\r\n", "billing", "message_id contains a control character (U+000D)"),
        ("m-1", "", "consumer must be a non-empty string"),
        ("m-1", "c" * (MAX_INBOX_CONSUMER_CHARS + 1), "consumer must be a non-empty string of at most 255"),
    ],
)
def test_a_message_id_or_consumer_that_cannot_be_recorded(db_url, conn, inbox_table, message_id, consumer, said):
    assert MAX_INBOX_MESSAGE_ID_CHARS == MAX_INBOX_CONSUMER_CHARS == 255
    with psycopg.connect(db_url) as pg, pg.transaction():
        with pytest.raises(InvalidMessage) as refused:
            INBOX.receive(pg, message_id, consumer=consumer)
        assert INBOX.receive(pg, "m-ok", consumer="billing")  # the transaction goes on
    assert said in str(refused.value)
    assert "nothing was recorded" in str(refused.value)
    assert conn.execute("SELECT message_id FROM billing_inbox").fetchall() == [{"message_id": "m-ok"}]


def test_the_longest_message_id_and_consumer_are_recorded(db_url, conn, inbox_table):
    longest, consumer = "m" * MAX_INBOX_MESSAGE_ID_CHARS, "c" * MAX_INBOX_CONSUMER_CHARS
    with psycopg.connect(db_url) as pg, pg.transaction():
        assert INBOX.receive(pg, longest, consumer=consumer)
    assert _count(conn) == 1


def test_a_table_never_created_names_the_declaration_and_the_command(db_url):
    with psycopg.connect(db_url) as pg, pytest.raises(UnknownTable) as refused:
        Inbox("orders_inbox").receive(pg, "m-1", consumer="billing")
    assert str(refused.value) == (
        "inbox table 'orders_inbox' does not exist: declare it in outbox.toml as [inboxes.orders_inbox] and run "
        "'outbox-pipelines db upgrade', which creates every declared inbox; nothing was recorded"
    )


def test_an_outbox_table_is_not_an_inbox(db_url, conn):
    with psycopg.connect(db_url) as pg, pytest.raises(UnknownTable) as refused:
        Inbox("outbox_events").receive(pg, "m-1", consumer="billing")
    assert "inbox table 'outbox_events' is not an inbox table" in str(refused.value)
    assert conn.execute("SELECT count(*) AS n FROM outbox_events").fetchone()["n"] == 0


def test_outside_a_transaction_is_refused_and_records_nothing(db_url, conn, inbox_table):
    with psycopg.connect(db_url, autocommit=True) as pg, pytest.raises(NoTransaction) as refused:
        INBOX.receive(pg, "m-1", consumer="billing")
    assert str(refused.value).startswith("inbox.receive(conn, ...) outside a transaction would record the message")
    assert "nothing was recorded" in str(refused.value)
    assert _count(conn) == 0


@pytest.mark.parametrize("name", ["Billing-Inbox", "1inbox", "pg_inbox", "outbox_audit", ""])
def test_a_name_that_cannot_be_an_inbox_is_refused_at_once(name):
    with pytest.raises(InvalidTableName) as refused:
        Inbox(name)
    assert "outbox table" not in str(refused.value).replace("outbox's own tables", "")


def test_an_asyncio_connection_given_to_receive_says_which_call_to_use(db_url, inbox_table):
    async def scenario() -> str:
        async with await psycopg.AsyncConnection.connect(db_url) as pg:
            with pytest.raises(TypeError) as refused:
                INBOX.receive(pg, "m-1", consumer="billing")
            return str(refused.value)

    said = asyncio.run(scenario())
    assert said.startswith("Inbox.receive needs a psycopg 3 Connection or Cursor")
    assert "await inbox.receive_async(conn, ...)" in said


def test_a_schema_older_than_the_code_is_refused_with_the_fix_and_nothing_recorded(db_url, conn, inbox_table):
    from outbox_pipelines.core.errors import MigrationError
    from outbox_pipelines_tests.core.test_enqueue_schema_check import BEHIND, NEWEST

    row = conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s RETURNING *", (NEWEST,)).fetchone()
    try:
        with psycopg.connect(db_url) as pg, pg.transaction(), pytest.raises(MigrationError) as refused:
            INBOX.receive(pg, "m-1", consumer="billing")
    finally:
        conn.execute(
            "INSERT INTO outbox_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            (row["version"], row["name"], row["checksum"]),
        )
    assert str(refused.value) == f"receive refused, nothing was recorded: {BEHIND}"
    assert _count(conn) == 0
