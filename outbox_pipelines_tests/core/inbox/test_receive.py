"""``Inbox.receive`` on the synchronous connections enqueue takes: True the first time, False for a repeat, one row
per (consumer, message id), kept or rolled back with the consumer's transaction; concurrent redeliveries of one
message: the second waits for the first and then answers by how it ended."""

import threading

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from outbox_pipelines import Inbox
from outbox_pipelines.core.storage.db import sqlalchemy_url

INBOX = Inbox("billing_inbox")


def _entries(conn) -> list[tuple[str, str]]:
    rows = conn.execute("SELECT consumer, message_id FROM billing_inbox ORDER BY consumer, message_id").fetchall()
    return [(row["consumer"], row["message_id"]) for row in rows]


def test_the_first_receive_is_true_and_a_repeat_false_with_one_row(db_url, conn, inbox_table):
    with psycopg.connect(db_url) as consumer:
        assert INBOX.receive(consumer, "m-1", consumer="billing") is True
        consumer.commit()
        assert INBOX.receive(consumer, "m-1", consumer="billing") is False
        consumer.commit()
    assert _entries(conn) == [("billing", "m-1")]
    (row,) = conn.execute("SELECT received_at, now() - received_at < interval '1 minute' AS recent FROM billing_inbox")
    assert row["recent"]


def test_each_consumer_receives_a_fanned_out_message_once(db_url, conn, inbox_table):
    with psycopg.connect(db_url) as consumer, consumer.transaction():
        assert INBOX.receive(consumer, "m-1", consumer="billing")
        assert INBOX.receive(consumer, "m-1", consumer="shipping")
        assert not INBOX.receive(consumer, "m-1", consumer="billing")
    assert _entries(conn) == [("billing", "m-1"), ("shipping", "m-1")]


def test_a_rollback_forgets_the_message_and_the_next_delivery_is_handled(db_url, conn, inbox_table):
    with psycopg.connect(db_url) as consumer:
        assert INBOX.receive(consumer, "m-1", consumer="billing")
        consumer.execute("INSERT INTO effects VALUES ('m-1')")
        consumer.rollback()
        assert _entries(conn) == []
        assert INBOX.receive(consumer, "m-1", consumer="billing")
        consumer.commit()
    assert _entries(conn) == [("billing", "m-1")]


def test_on_the_applications_cursor_in_autocommit_inside_a_transaction_block(db_url, conn, inbox_table):
    with psycopg.connect(db_url, autocommit=True) as consumer, consumer.transaction(), consumer.cursor() as cur:
        assert INBOX.receive(cur, "m-1", consumer="billing")
        assert not INBOX.receive(cur, "m-1", consumer="billing")
    assert _entries(conn) == [("billing", "m-1")]


@pytest.mark.parametrize("session", [False, True], ids=["connection", "session"])
def test_on_sqlalchemy(db_url, conn, inbox_table, session):
    engine = create_engine(sqlalchemy_url(db_url))
    try:
        for attempt in (1, 2):
            if session:
                with Session(engine) as handle, handle.begin():
                    received = INBOX.receive(handle, "m-1", consumer="billing")
                    if received:
                        handle.execute(text("INSERT INTO effects VALUES ('m-1')"))
            else:
                with engine.begin() as handle:
                    received = INBOX.receive(handle, "m-1", consumer="billing")
                    if received:
                        handle.execute(text("INSERT INTO effects VALUES ('m-1')"))
            assert received is (attempt == 1)
    finally:
        engine.dispose()
    assert _entries(conn) == [("billing", "m-1")]
    assert conn.execute("SELECT count(*) AS n FROM effects").fetchone()["n"] == 1


def _wait_until_blocked(conn, pid: int) -> None:
    """Until session ``pid`` waits on a lock (polled every 10 ms, at most 5 s)."""
    for _ in range(500):
        row = conn.execute(
            "SELECT wait_event_type = 'Lock' AS blocked, pg_sleep(0.01) FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row["blocked"]:
            return
    pytest.fail("the second receive never waited on the first's row")


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_a_concurrent_redelivery_waits_for_the_first_and_answers_by_its_end(db_url, conn, inbox_table, first_ends):
    """Two consumers' transactions receive the same message: the second's INSERT waits on the first's row lock
    (seen in pg_stat_activity, not by sleeping), then returns False if the first committed, True if it rolled
    back."""
    answers: dict[str, bool] = {}
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        assert INBOX.receive(first, "m-1", consumer="billing")

        def redelivery() -> None:
            answers["second"] = INBOX.receive(second, "m-1", consumer="billing")
            second.commit()

        thread = threading.Thread(target=redelivery)
        thread.start()
        _wait_until_blocked(conn, second.info.backend_pid)
        assert "second" not in answers  # still waiting
        first.commit() if first_ends == "commit" else first.rollback()
        thread.join(timeout=10)
    assert answers == {"second": first_ends == "rollback"}
    assert _entries(conn) == [("billing", "m-1")]


def test_under_repeatable_read_a_delivery_committed_after_the_snapshot_is_a_serialization_failure(
    db_url, conn, inbox_table
):
    """The transaction cannot see the other delivery's entry, so it is not told False: PostgreSQL refuses it, and a
    consumer that retries its transaction then gets False."""
    with psycopg.connect(db_url) as late, psycopg.connect(db_url) as other:
        late.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        late.execute("SELECT 1")  # the snapshot is taken
        assert INBOX.receive(other, "m-1", consumer="billing")
        other.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            INBOX.receive(late, "m-1", consumer="billing")
        late.rollback()
        assert INBOX.receive(late, "m-1", consumer="billing") is False
    assert _entries(conn) == [("billing", "m-1")]
