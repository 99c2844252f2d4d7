"""Enqueue: in the caller's transaction, idempotent by event_id, checked before writing."""

import json
import multiprocessing
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.rows import dict_row

from outbox_pipelines import InvalidMessage, InvalidTableName, Message, Outbox, UnknownTable
from outbox_pipelines.core.canonical import canonical_json, digest
from outbox_pipelines.core.models import (
    MAX_EVENT_ID_CHARS,
    MAX_ORDERING_KEY_CHARS,
    MAX_TENANT_ID_CHARS,
    MAX_TOPIC_CHARS,
)
from outbox_pipelines.core.storage.db import sqlalchemy_url


def count(conn, table="outbox_events", where="true"):
    return conn.execute(f"SELECT count(*) AS n FROM {table} WHERE {where}").fetchone()["n"]


def test_rollback_leaves_no_message_psycopg(db_url, conn):
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")
    with psycopg.connect(db_url) as tx_conn:
        tx_conn.execute("INSERT INTO business VALUES (1)")
        Outbox("outbox_events").enqueue(tx_conn, Message(topic="org.changed", payload={"org_id": 1}))
        tx_conn.rollback()
    assert count(conn, "business") == 0
    assert count(conn) == 0


def test_commit_keeps_business_row_and_message_sqlalchemy(db_url, conn):
    engine = sa.create_engine(sqlalchemy_url(db_url))
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")
    with engine.begin() as sa_conn:
        sa_conn.execute(sa.text("INSERT INTO business VALUES (1)"))
        result = Outbox("outbox_events").enqueue(
            sa_conn, Message(topic="org.changed", payload={"org_id": 1}, event_id="e-1")
        )
    with pytest.raises(RuntimeError):
        with engine.begin() as sa_conn:
            sa_conn.execute(sa.text("INSERT INTO business VALUES (2)"))
            Outbox("outbox_events").enqueue(
                sa_conn, Message(topic="org.changed", payload={"org_id": 2}, event_id="e-2")
            )
            raise RuntimeError("business logic failed")
    engine.dispose()
    assert result.duplicate is False
    assert count(conn, "business") == 1
    rows = conn.execute("SELECT event_id FROM outbox_events").fetchall()
    assert [r["event_id"] for r in rows] == ["e-1"]


def test_payload_is_stored_with_canonical_digest(conn):
    payload = {"b": [1, 2, {"z": "ü"}], "a": "x"}
    result = Outbox("outbox_events").enqueue(
        conn, Message(topic="t", payload=payload, headers={"trace_id": "tr-1"}), outside_transaction=True
    )
    row = conn.execute("SELECT payload, payload_sha, headers FROM outbox_events WHERE id = %s", (result.id,)).fetchone()
    assert row["payload"] == payload
    assert row["payload_sha"] == digest('{"a":"x","b":[1,2,{"z":"ü"}]}')
    assert row["payload_sha"] == digest(canonical_json({"a": "x", "b": [1, 2, {"z": "ü"}]}))
    assert row["headers"] == {"trace_id": "tr-1"}


def test_duplicate_event_id_returns_existing_row(conn):
    outbox = Outbox("outbox_events")
    first = outbox.enqueue(conn, Message(topic="t", payload={"n": 1}, event_id="same"), outside_transaction=True)
    again = outbox.enqueue(conn, Message(topic="t", payload={"n": 1}, event_id="same"), outside_transaction=True)
    other_body = outbox.enqueue(conn, Message(topic="t", payload={"n": 2}, event_id="same"), outside_transaction=True)
    assert (again.id, again.duplicate, again.same_payload) == (first.id, True, True)
    assert (other_body.id, other_body.duplicate, other_body.same_payload) == (first.id, True, False)
    assert count(conn) == 1


def test_enqueue_many_in_order_with_duplicates(conn):
    outbox = Outbox("outbox_events")
    existing = outbox.enqueue(conn, Message(topic="t", payload={"n": 0}, event_id="e0"), outside_transaction=True)
    results = outbox.enqueue_many(
        conn, [Message(topic="t", payload={"n": n}, event_id=f"e{n % 3}") for n in range(5)], outside_transaction=True
    )
    assert [r.event_id for r in results] == ["e0", "e1", "e2", "e0", "e1"]
    assert [r.duplicate for r in results] == [True, False, False, True, True]
    assert results[0].id == existing.id
    assert results[1].id == results[4].id
    assert count(conn) == 3


def test_enqueue_many_rejects_whole_batch_on_one_bad_message(conn):
    with pytest.raises(InvalidMessage, match="JSON object"):
        Outbox("outbox_events").enqueue_many(
            conn, [Message(topic="t", payload={"ok": 1}), Message(topic="t", payload=[1, 2])], outside_transaction=True
        )
    assert count(conn) == 0


def _insert_same_key(url: str, barrier, results) -> None:
    with psycopg.connect(url) as conn:
        barrier.wait(timeout=30)
        result = Outbox("outbox_events").enqueue(
            conn, Message(topic="t", payload={"k": 1}, event_id="contended"), outside_transaction=True
        )
        conn.commit()
        results.put((result.id, result.duplicate))


@pytest.mark.slow
def test_eight_processes_enqueue_the_same_key_once(db_url, conn):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_insert_same_key, args=(db_url, barrier, results)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    answers = [results.get(timeout=5) for _ in procs]
    assert len({row_id for row_id, _ in answers}) == 1
    assert sorted(dup for _, dup in answers) == [False] + [True] * 7
    assert count(conn) == 1


def test_notify_reaches_listener_on_commit_only(db_url):
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as writer:
        listener.execute('LISTEN "outbox:outbox_events"')
        Outbox("outbox_events").enqueue(writer, Message(topic="t", payload={}))
        assert list(listener.notifies(timeout=0.2)) == []  # not before commit
        writer.commit()
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.channel for n in got] == ["outbox:outbox_events"]
        Outbox("outbox_events").enqueue(writer, Message(topic="t", payload={}))
        writer.rollback()
        assert list(listener.notifies(timeout=0.2)) == []  # nor after a rollback


def test_available_at_delays_the_message(conn):
    later = datetime.now(UTC) + timedelta(hours=1)
    result = Outbox("outbox_events").enqueue(
        conn, Message(topic="t", payload={}, available_at=later), outside_transaction=True
    )
    row = conn.execute("SELECT available_at FROM outbox_events WHERE id = %s", (result.id,)).fetchone()
    assert abs((row["available_at"] - later).total_seconds()) < 0.001


@pytest.mark.parametrize("ordering_key", [None, "order-7"])
def test_the_injected_clock_dates_a_message_unless_it_has_its_own_available_at(conn, ordering_key):
    """``enqueue(..., now=)`` (the tests' clock): a message without available_at is due at that time, one with
    it keeps its own; without either, the database's clock. Keyed or not, the same."""
    outbox, clock = Outbox("outbox_events"), datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    own = clock + timedelta(hours=1)
    dated = outbox.enqueue(
        conn, Message(topic="t", payload={}, ordering_key=ordering_key), now=clock, outside_transaction=True
    )
    kept = outbox.enqueue(
        conn,
        Message(topic="t", payload={}, available_at=own, ordering_key=ordering_key),
        now=clock,
        outside_transaction=True,
    )
    plain = outbox.enqueue(conn, Message(topic="t", payload={}, ordering_key=ordering_key), outside_transaction=True)
    due = {
        r["id"]: r["available_at"]
        for r in conn.execute(
            "SELECT id, available_at FROM outbox_events WHERE id = ANY(%s)", ([dated.id, kept.id, plain.id],)
        )
    }
    assert (due[dated.id], due[kept.id]) == (clock, own)
    assert abs((due[plain.id] - datetime.now(UTC)).total_seconds()) < 60


@pytest.mark.parametrize(
    "message, error",
    [
        (Message(topic="t", payload="not json"), "not valid JSON"),
        (Message(topic="t", payload="[1, 2]"), "must be a JSON object"),
        (Message(topic="t", payload=["a"]), "must be a JSON object"),
        (Message(topic="t", payload=42), "must be a JSON object"),
        (Message(topic="t", payload={"s": "a\u0000b"}), r"\$\.s contains \\u0000"),
        (Message(topic="t", payload={"deep": [{"x": "\u0000"}]}), r"\$\.deep\[0\]\.x"),
        (Message(topic="t", payload={"f": float("nan")}), "JSON cannot represent"),
        (Message(topic="t", payload={"o": object()}), "not JSON-serialisable"),
        (Message(topic="", payload={}), "topic must be a non-empty string"),
        (Message(topic="t", payload={}, event_id=""), "event_id"),
        (Message(topic="t", payload={}, event_id="x" * 256), "event_id"),
        (Message(topic="t", payload={}, available_at=datetime(2030, 1, 1)), "timezone-aware"),
        (Message(topic="t", payload=b"\xff\xfe"), "not valid UTF-8"),
    ],
)
def test_bad_messages_are_refused_and_nothing_is_written(conn, message, error):
    with pytest.raises(InvalidMessage, match=error):
        Outbox("outbox_events").enqueue(conn, message, outside_transaction=True)
    assert count(conn) == 0


def test_payload_over_the_size_limit(conn, monkeypatch):
    monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "1000")
    with pytest.raises(InvalidMessage, match="over the limit of 1000 bytes"):
        Outbox("outbox_events").enqueue(
            conn, Message(topic="t", payload={"blob": "x" * 1000}), outside_transaction=True
        )
    Outbox("outbox_events", max_payload_bytes=5000).enqueue(
        conn, Message(topic="t", payload={"blob": "x" * 1000}), outside_transaction=True
    )
    assert count(conn) == 1


def test_default_size_limit_is_one_mebibyte(conn):
    with pytest.raises(InvalidMessage, match="1048576"):
        Outbox("outbox_events").enqueue(
            conn, Message(topic="t", payload={"blob": "x" * (1024 * 1024)}), outside_transaction=True
        )


@pytest.mark.parametrize("name", ["Outbox", "1table", "a-b", "x; DROP TABLE y", "", "a" * 64, None])
def test_invalid_table_names_are_refused(name):
    with pytest.raises(InvalidTableName, match="invalid outbox table name"):
        Outbox(name)


def test_unknown_table_says_how_to_create_it(conn):
    with pytest.raises(UnknownTable, match="db create-table hrm_outbox"):
        Outbox("hrm_outbox").enqueue(conn, Message(topic="t", payload={}), outside_transaction=True)


def test_a_failed_enqueue_does_not_poison_the_business_transaction_silently(db_url):
    """InvalidMessage is raised before any SQL, so the caller's transaction is still usable."""
    with psycopg.connect(db_url, row_factory=dict_row) as tx_conn:
        tx_conn.execute("CREATE TABLE business (id int)")
        with pytest.raises(InvalidMessage):
            Outbox("outbox_events").enqueue(tx_conn, Message(topic="t", payload="{"))
        tx_conn.execute("INSERT INTO business VALUES (1)")
        Outbox("outbox_events").enqueue(tx_conn, Message(topic="t", payload={"ok": True}))
        tx_conn.commit()
        assert tx_conn.execute("SELECT count(*) AS n FROM outbox_events").fetchone()["n"] == 1


def test_the_enqueue_api_imports_no_http_client():
    """An application that only enqueues does not pay for the relay's HTTP stack (aiohttp, httpx)."""
    probe = (
        "import sys; from outbox_pipelines import Message, Outbox; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'httpx', 'dagster'}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_enqueue_then_read(conn):
    result = Outbox("outbox_events").enqueue(
        conn, Message(topic="t", payload={"a": 1}, event_id="e1"), outside_transaction=True
    )
    assert result.duplicate is False
    row = conn.execute("SELECT status, payload, payload_sha FROM outbox_events WHERE id = %s", (result.id,)).fetchone()
    assert row["status"] == "pending"
    assert row["payload"] == {"a": 1}
    assert row["payload_sha"].startswith("sha256:")


# -- a large batch: COPY, with the same guarantees ------------------------------------------
from outbox_pipelines.core.enqueue import COPY_MIN_ROWS  # noqa: E402


def _batch(prefix: str, count_: int = COPY_MIN_ROWS * 3) -> list[Message]:
    return [Message(topic="t", payload={"n": n}, event_id=f"{prefix}-{n}") for n in range(count_)]


def test_a_large_batch_is_written_in_one_copy_and_gets_its_ids_in_order(db_url, conn):
    with psycopg.connect(db_url) as writer:
        # An idle connection outside autocommit: the batch joins the transaction it opens.
        results = Outbox("outbox_events").enqueue_many(writer, _batch("big"))
        assert count(conn) == 0  # not visible before the caller commits
        writer.commit()
    rows = conn.execute(
        "SELECT id, event_id, payload, payload_sha, status, available_at <= now() AS due FROM outbox_events ORDER BY id"
    ).fetchall()
    assert [r["event_id"] for r in rows] == [r.event_id for r in results] == [f"big-{n}" for n in range(len(rows))]
    assert [r["id"] for r in rows] == [r.id for r in results]
    assert all(r["status"] == "pending" and r["due"] for r in rows)
    assert rows[5]["payload"] == {"n": 5} and rows[5]["payload_sha"] == digest('{"n":5}')


def test_a_large_batch_rolled_back_by_the_caller_leaves_nothing(db_url, conn):
    engine = sa.create_engine(sqlalchemy_url(db_url))
    with pytest.raises(RuntimeError):
        with engine.begin() as sa_conn:
            Outbox("outbox_events").enqueue_many(sa_conn, _batch("gone"))
            raise RuntimeError("business logic failed")
    with engine.begin() as sa_conn:
        sa_conn.execute(sa.text("CREATE TABLE business (id int PRIMARY KEY)"))
        sa_conn.execute(sa.text("INSERT INTO business VALUES (1)"))
        Outbox("outbox_events").enqueue_many(sa_conn, _batch("kept"))
    engine.dispose()
    assert count(conn, where="event_id LIKE 'gone-%%'") == 0
    assert count(conn, where="event_id LIKE 'kept-%%'") == COPY_MIN_ROWS * 3
    assert count(conn, "business") == 1


def test_a_large_batch_with_stored_duplicates_reports_them_and_keeps_the_transaction(db_url, conn):
    outbox = Outbox("outbox_events")
    stored = outbox.enqueue(conn, Message(topic="t", payload={"n": 1}, event_id="dup-1"), outside_transaction=True)
    other = outbox.enqueue(conn, Message(topic="t", payload={"n": 999}, event_id="dup-2"), outside_transaction=True)
    with psycopg.connect(db_url) as writer:
        writer.execute("CREATE TABLE business (id int PRIMARY KEY)")
        writer.execute("INSERT INTO business VALUES (1)")
        # The COPY meets dup-1 and dup-2, is rolled back to its savepoint, and the batch is
        # inserted skipping them; the business row written before it stays.
        results = outbox.enqueue_many(writer, _batch("dup"))
        writer.commit()
    by_event = {r.event_id: r for r in results}
    dup_1, dup_2 = by_event["dup-1"], by_event["dup-2"]
    assert (dup_1.id, dup_1.duplicate, dup_1.same_payload) == (stored.id, True, True)
    assert (dup_2.id, dup_2.duplicate, dup_2.same_payload) == (other.id, True, False)
    assert sum(r.duplicate for r in results) == 2
    assert count(conn) == COPY_MIN_ROWS * 3
    assert count(conn, "business") == 1


def test_a_large_batch_wakes_the_relay_on_commit_only(db_url):
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as writer:
        listener.execute('LISTEN "outbox:outbox_events"')
        Outbox("outbox_events").enqueue_many(writer, _batch("wake"))
        assert list(listener.notifies(timeout=0.2)) == []
        writer.commit()
        assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == ["outbox:outbox_events"]
        Outbox("outbox_events").enqueue_many(writer, _batch("unwoken"))
        writer.rollback()
        assert list(listener.notifies(timeout=0.2)) == []


def test_a_large_batch_with_one_bad_message_writes_nothing(conn):
    batch = _batch("bad")
    batch[-1] = Message(topic="t", payload={"bad": float("nan")}, event_id="bad-last")
    with pytest.raises(InvalidMessage, match="NaN"):
        Outbox("outbox_events").enqueue_many(conn, batch, outside_transaction=True)
    assert count(conn) == 0


def test_a_large_batch_of_delayed_messages_keeps_each_available_at(conn):
    later = datetime.now(UTC) + timedelta(hours=1)
    batch = [
        Message(topic="t", payload={}, event_id=f"late-{n}", available_at=later if n % 2 else None)
        for n in range(COPY_MIN_ROWS * 2)
    ]
    Outbox("outbox_events").enqueue_many(conn, batch, outside_transaction=True)
    assert count(conn, where="available_at > now() + interval '59 minutes'") == COPY_MIN_ROWS


# -- a large batch streams into its COPY: a bad message found late still writes nothing ---------------
def _order(n: int) -> dict:
    return {"order_id": f"ord-{n:09d}", "lines": [{"sku": f"sku-{n % 7}", "qty": n % 3 + 1}] * 4, "note": "x" * 200}


def test_a_small_batch_names_its_bad_message_and_writes_nothing(conn):
    """Below the COPY threshold too: which message of the batch, by position and event_id, then the words."""
    batch = [
        Message(topic="t", payload={"n": 0}, event_id="small-0"),
        Message(topic="", payload={"n": 1}, event_id="small-1"),
        Message(topic="t", payload={"n": 2}),
    ]
    with pytest.raises(InvalidMessage) as caught:
        Outbox("outbox_events").enqueue_many(conn, batch, outside_transaction=True)
    assert str(caught.value) == (
        "message at index 1 of the batch (event_id 'small-1'): message topic must be a non-empty string"
    )
    with pytest.raises(InvalidMessage, match=r"^message at index 1 of the batch: expected a Message, got dict$"):
        Outbox("outbox_events").enqueue_many(conn, [batch[0], {"topic": "t"}], outside_transaction=True)  # type: ignore[list-item]
    assert count(conn) == 0


def test_a_bad_message_after_rows_were_streamed_writes_nothing_and_keeps_the_callers_transaction(db_url, conn):
    # 3,000 messages of ~400 bytes cross in many COPY messages; the bad one is near the end, so most
    # of the batch reached the server before it was found.
    batch = [Message(topic="t", payload=_order(n), event_id=f"late-bad-{n}") for n in range(3_000)]
    batch[2_900] = Message(topic="t", payload={"n": 2_900, "x": [1, float("inf")]}, event_id="late-bad-2900")
    with pytest.raises(InvalidMessage) as single:
        Outbox("outbox_events").enqueue(conn, batch[2_900], outside_transaction=True)
    with psycopg.connect(db_url) as writer:
        writer.execute("CREATE TABLE business (id int PRIMARY KEY)")
        writer.execute("INSERT INTO business VALUES (1)")
        with pytest.raises(InvalidMessage) as many:
            Outbox("outbox_events").enqueue_many(writer, batch)
        # the same words as for the message alone, after which message of the batch it is
        assert str(many.value) == f"message at index 2900 of the batch (event_id 'late-bad-2900'): {single.value}"
        # The caller's transaction goes on: the good part of the batch, then commit.
        Outbox("outbox_events").enqueue_many(writer, batch[:2_900])
        writer.commit()
    assert count(conn, "business") == 1
    assert count(conn) == 2_900
    assert count(conn, where="event_id = 'late-bad-2900'") == 0


def _reference_text(value) -> str:
    """Canonical JSON as the json module writes it (a UUID as its text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)


def test_a_large_batch_stores_every_message_as_a_single_enqueue_would(db_url, conn):
    # Messages that each leave the common path somewhere (json instead of orjson, escaped COPY text,
    # a tenant, a generated event_id), mixed with plain ones, in one COPY.
    unusual = [
        Message(topic="t", payload={"none": None, "n": 1}, event_id="u-null"),
        Message(topic="t", payload={"tiny": 1.5e-7, "small": 0.00001}, event_id="u-small-float"),
        Message(topic="t", payload={"q": 'say "hi"\n\ttab', "path": "C:\\dir\\file"}, event_id="u-escapes"),
        Message(topic="t", payload={"text": "é ü 漢字 \u2028 😀", "nbsp": "a\u00a0b"}, event_id="u-unicode"),
        Message(topic="t", payload={"id": uuid.UUID(int=5)}, event_id="u-uuid"),
        Message(topic="t", payload='{"b": 2, "a": 1}', event_id="u-json-text"),
        Message(topic="t", payload={"n": 2}, event_id="u-back\\slash", tenant_id="tenant\\1"),
        Message(topic="topic\\with\\backslash", payload={"n": 3}, event_id="u-topic", tenant_id="acme"),
        Message(topic="t", payload={"n": 4}, event_id="u-headers", headers={"trace_id": "é", "k": "a\\b"}),
        Message(topic="t", payload={"n": 5}),
    ]
    batch = [
        Message(topic="t", payload=_order(n), event_id=f"plain-{n}", headers={"trace_id": f"tr-{n}"})
        for n in range(100)
    ]
    for index, message in enumerate(unusual):
        batch.insert(index * 9, message)
    with psycopg.connect(db_url) as writer:
        results = Outbox("outbox_events").enqueue_many(writer, batch)
        writer.commit()
    assert [r.duplicate for r in results] == [False] * len(batch)
    stored = {
        row["event_id"]: row
        for row in conn.execute(
            "SELECT id, event_id, tenant_id, topic, payload, payload_sha, headers FROM outbox_events"
        )
    }
    assert len(stored) == len(batch)
    for message, result in zip(batch, results, strict=True):
        row = stored[result.event_id]
        payload = json.loads(message.payload) if isinstance(message.payload, str) else message.payload
        text = _reference_text(payload)
        assert row["id"] == result.id
        assert row["payload_sha"] == digest(text), message
        assert row["payload"] == json.loads(text)
        assert (row["tenant_id"], row["topic"], row["headers"]) == (message.tenant_id, message.topic, message.headers)
        if message.event_id is not None:
            assert row["event_id"] == message.event_id
    generated = results[[m.event_id for m in batch].index(None)]
    assert str(uuid.UUID(generated.event_id)) == generated.event_id


def test_headers_none_means_no_headers_in_one_enqueue_and_in_a_batch(conn):
    outbox = Outbox("outbox_events")
    outbox.enqueue(
        conn, Message(topic="t", payload={"n": 0}, event_id="no-headers-0", headers=None), outside_transaction=True
    )
    outbox.enqueue_many(
        conn,
        [
            Message(topic="t", payload={"n": n}, event_id=f"no-headers-{n}", headers=None)
            for n in range(1, COPY_MIN_ROWS + 1)
        ],
        outside_transaction=True,
    )
    rows = conn.execute("SELECT headers FROM outbox_events WHERE event_id LIKE 'no-headers-%%'").fetchall()
    assert [r["headers"] for r in rows] == [{}] * (COPY_MIN_ROWS + 1)
    assert Message(topic="t", payload={}).headers == {}


def test_a_large_batch_nests_inside_the_callers_own_savepoints(db_url, conn):
    # The batch's savepoint is opened and released by enqueue_many; psycopg's nested transaction
    # blocks around it keep their meaning: the inner block's failure undoes only what it wrote.
    with psycopg.connect(db_url) as writer:
        with writer.transaction():
            Outbox("outbox_events").enqueue_many(writer, _batch("kept"))
            with pytest.raises(RuntimeError), writer.transaction():
                Outbox("outbox_events").enqueue_many(writer, _batch("undone"))
                raise RuntimeError("the inner business step failed")
            Outbox("outbox_events").enqueue_many(writer, _batch("after"))
    assert count(conn, where="event_id LIKE 'kept-%%'") == COPY_MIN_ROWS * 3
    assert count(conn, where="event_id LIKE 'undone-%%'") == 0
    assert count(conn, where="event_id LIKE 'after-%%'") == COPY_MIN_ROWS * 3


def test_a_large_batch_into_an_unknown_table_keeps_the_callers_transaction(db_url, conn):
    with psycopg.connect(db_url) as writer:
        writer.execute("CREATE TABLE business (id int PRIMARY KEY)")
        writer.execute("INSERT INTO business VALUES (1)")
        with pytest.raises(UnknownTable, match="db create-table hrm_outbox"):
            Outbox("hrm_outbox").enqueue_many(writer, _batch("lost"))
        Outbox("outbox_events").enqueue_many(writer, _batch("found"))
        writer.commit()
    assert count(conn, "business") == 1
    assert count(conn) == COPY_MIN_ROWS * 3


_EDGE_MESSAGES = [
    Message(topic="t", payload={"a": 1}, event_id="plain"),
    Message(topic="t", payload={"a": 1}, event_id="x" * MAX_EVENT_ID_CHARS),
    Message(topic="t", payload={"a": 1}, event_id="x" * (MAX_EVENT_ID_CHARS + 1)),
    Message(topic="t", payload={"a": 1}, event_id=""),
    Message(topic="  ", payload={"a": 1}, event_id="blank-topic"),
    Message(topic="t\u00a0nbsp", payload={"a": 1}, event_id="no-break-space"),  # not isprintable(), still valid
    Message(topic="order created", payload={"a": 1}, event_id="plain space"),
    Message(topic="t", payload={"a": 1}, event_id="tab\there"),
    Message(topic="t\x85", payload={"a": 1}, event_id="c1-control"),
    Message(topic="t", payload={"a": 1}, event_id="surrogate\ud800"),
    Message(topic="t", payload={"a": 1}, event_id="empty-tenant", tenant_id=""),
    Message(topic="t", payload={"a": 1}, event_id="tenant", tenant_id="acme"),
    Message(topic="t", payload={"a": 1}, event_id="tenant-lf", tenant_id="ac\nme"),
    Message(topic="t", payload={"a": 1}, event_id="tenant-int", tenant_id=7),  # type: ignore[arg-type]
    Message(topic="t" * MAX_TOPIC_CHARS, payload={"a": 1}, event_id="topic-at-limit"),
    Message(topic="t" * (MAX_TOPIC_CHARS + 1), payload={"a": 1}, event_id="long-topic"),
    Message(topic="t", payload={"a": 1}, event_id="tenant-at-limit", tenant_id="a" * MAX_TENANT_ID_CHARS),
    Message(topic="t", payload={"a": 1}, event_id="long-tenant", tenant_id="a" * (MAX_TENANT_ID_CHARS + 1)),
    Message(topic="t", payload={"a": 1}, event_id="key", ordering_key="k" * MAX_ORDERING_KEY_CHARS),
    Message(topic="t", payload={"a": 1}, event_id="long-key", ordering_key="k" * (MAX_ORDERING_KEY_CHARS + 1)),
    Message(topic="t", payload={"a": 1}, event_id="empty-key", ordering_key=""),
    Message(topic=7, payload={"a": 1}, event_id="int-topic"),  # type: ignore[arg-type]
    Message(topic="t", payload={"a": 1}, event_id=7),  # type: ignore[arg-type]
    Message(topic="t", payload={"a": None, "f": 0.5e-7}, event_id="null-and-small-float"),
    Message(topic="t", payload={"s": "a\u0000b"}, event_id="nul"),
    Message(topic="t", payload={"h": 1}, event_id="header-cr", headers={"x": "a\rb"}),
    Message(topic="t", payload={"h": 1}, event_id="header-nested", headers={"x": {"y": ["\u00e9", 1]}}),
    Message(topic="t", payload='{"as": "text"}', event_id="text-payload"),
    Message(topic="t", payload={"a": 1}, event_id="dated", available_at=datetime(2030, 1, 1, tzinfo=UTC)),
    Message(topic="t", payload={"a": 1}, event_id="naive", available_at=datetime(2030, 1, 1)),
    Message(topic="t", payload={1: "int key"}, event_id="int-key"),
]


@pytest.mark.parametrize("message", _EDGE_MESSAGES, ids=lambda m: str(m.event_id)[:20])
def test_the_one_row_shortcut_gives_the_full_checks_row_or_error(message):
    """enqueue checks one message by a shortcut (one printable test of the identifiers, one orjson call
    each for payload and headers); whatever it accepts or refuses, _prepare's full walk does the same."""
    from outbox_pipelines.core.enqueue import _prepare, _prepare_one

    def outcome(prepare):
        try:
            return prepare(message, 1 << 20)
        except InvalidMessage as exc:
            return f"InvalidMessage: {exc}"

    assert outcome(_prepare_one) == outcome(_prepare)


@pytest.mark.parametrize("message", _EDGE_MESSAGES, ids=lambda m: str(m.event_id)[:20])
def test_the_batch_shortcut_gives_the_full_checks_rows_or_error(message):
    """enqueue_many checks a batch's identifiers a column at a time (_plain_event_ids); whatever it accepts or
    refuses, the full walk over each message does the same: one rule, whichever path a message takes."""
    from outbox_pipelines.core.enqueue import _plain_event_ids, _prepared_rows

    batch = [Message(topic="t", payload={"a": 1}, event_id="first"), message]

    def outcome(event_ids):
        try:
            return list(_prepared_rows(batch, 1 << 20, event_ids))
        except InvalidMessage as exc:
            return f"InvalidMessage: {exc}"

    assert outcome(_plain_event_ids(batch)) == outcome(None)


def test_the_one_row_shortcut_gives_a_message_without_event_id_a_new_uuid():
    from outbox_pipelines.core.enqueue import _prepare_one

    first, second = (_prepare_one(Message(topic="t", payload={"a": 1}), 1 << 20) for _ in range(2))
    assert first.event_id != second.event_id
    assert uuid.UUID(first.event_id).version == 4
