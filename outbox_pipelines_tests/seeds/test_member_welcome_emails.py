"""Seed 002 end to end: MemberCreatedEvent → welcome email → automated_email_recipients; success deletes."""

from dataclasses import replace

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.relay import run_table_relay
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.examples import members
from outbox_pipelines_tests.helpers import audit_codes, rows, statuses
from outbox_pipelines_tests.rows import make_due

TABLE = "outbox_members"


@pytest.fixture
def mail_dir(tmp_path, monkeypatch, db_url):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    members.use_mailer(members.FolderMailer(tmp_path / "mail"))
    members.registry.set_enabled(members.TOPIC, True)
    yield tmp_path / "mail"
    members.use_mailer(members.LogMailer())
    members.registry.set_enabled(members.TOPIC, True)


def relay(db_url, **overrides):
    settings = load_settings(env={}, path=None)
    table = replace(settings.table(TABLE), **overrides)
    settings.tables[TABLE] = table
    return run_table_relay(db_url, settings, TABLE, once=True)


def member_created(conn, n: int, **payload):
    body = {"member_id": n, "email": f"m{n}@example.test", "name": f"Member {n}", **payload}
    return (
        Outbox(TABLE)
        .enqueue(conn, Message(topic=members.TOPIC, payload=body, event_id=f"member-{n}"), outside_transaction=True)
        .id
    )


def test_welcome_email_is_sent_recorded_and_the_row_deleted(db_url, conn, mail_dir):
    conn.execute("CREATE TABLE members (id int PRIMARY KEY, email text)")
    with conn.transaction():  # the business write and the event in one transaction
        conn.execute("INSERT INTO members VALUES (1, 'm1@example.test')")
        row_id = member_created(conn, 1)
    report = relay(db_url)
    assert report.sent == 1
    assert rows(conn, TABLE) == []  # success policy: delete
    assert audit_codes(conn, TABLE, row_id) == ["outbox_flush_success"]  # one row per attempt (claim = "auto")
    [record] = conn.execute("SELECT member_id, email, email_type, event_id FROM automated_email_recipients").fetchall()
    assert record == {"member_id": "1", "email": "m1@example.test", "email_type": "welcome", "event_id": "member-1"}
    [mail] = list(mail_dir.iterdir())
    assert "To: m1@example.test" in mail.read_text() and "Welcome, Member 1!" in mail.read_text()


def test_a_redelivered_event_sends_no_second_email(db_url, conn, mail_dir):
    member_created(conn, 2)
    relay(db_url)
    Outbox(TABLE).enqueue(
        conn,
        Message(topic=members.TOPIC, payload={"member_id": 2, "email": "m2@example.test"}, event_id="member-2"),
        outside_transaction=True,
    )  # the same event again (deleted row, so inserted anew)
    relay(db_url)
    assert conn.execute("SELECT count(*) AS n FROM automated_email_recipients").fetchone()["n"] == 1
    assert len(list(mail_dir.iterdir())) == 1


def test_failures_retry_up_to_the_maximum_then_dead(db_url, conn, mail_dir):
    class Down:
        def send(self, message):
            raise ConnectionError("smtp unreachable " + "x" * 3000)

    members.use_mailer(Down())
    row_id = member_created(conn, 3)
    # Ghost: (retryCount + 1) <= MAX_RETRIES ? PENDING : FAILED with MAX_RETRIES = 5 -> 5 retries, FAILED on the 6th
    for attempt in range(1, 7):
        make_due(conn, TABLE)
        relay(db_url)
        assert rows(conn, TABLE)[0]["attempts"] == attempt
        assert rows(conn, TABLE)[0]["status"] == ("pending" if attempt < 6 else "dead")
    row = rows(conn, TABLE)[0]
    assert (row["status"], row["last_error_code"]) == ("dead", "HANDLER_ERROR")
    assert len(row["last_error"]) <= 2000 and "smtp unreachable" in row["last_error"]
    assert audit_codes(conn, TABLE, row_id).count("outbox_flush_retry") == 5
    assert conn.execute("SELECT count(*) AS n FROM automated_email_recipients").fetchone()["n"] == 0


def test_missing_handler_and_unparsable_payload_are_recorded_not_lost(db_url, conn, mail_dir):
    Outbox(TABLE).enqueue(
        conn,
        Message(topic="MemberDeletedEvent", payload={"member_id": 4}, event_id="deleted-4"),
        outside_transaction=True,
    )
    member_created(conn, 5, email="not-an-email")
    relay(db_url)
    by_event = {r["event_id"]: r for r in rows(conn, TABLE)}
    unrouted, malformed = by_event["deleted-4"], by_event["member-5"]
    assert (unrouted["status"], unrouted["last_error_code"], unrouted["attempts"]) == ("pending", "NO_SUBSCRIBERS", 1)
    assert "MemberDeletedEvent" in unrouted["last_error"]
    assert (malformed["status"], malformed["last_error_code"]) == ("dead", "BAD_PAYLOAD")


def test_the_per_topic_switch_pauses_welcome_emails(db_url, conn, mail_dir):
    members.registry.set_enabled(members.TOPIC, False)
    member_created(conn, 6)
    assert relay(db_url).claimed == 0
    assert statuses(conn, TABLE) == {"pending": 1}
    members.registry.set_enabled(members.TOPIC, True)
    assert relay(db_url).sent == 1
    assert statuses(conn, TABLE) == {}


def test_a_failed_delete_after_success_marks_the_entry_completed_not_failed(db_url, conn, mail_dir):
    """Ghost: 'エントリ削除失敗 → COMPLETED'. The email went out; a replay must not send it again."""
    row_id = member_created(conn, 7)
    conn.execute("CREATE TABLE member_notes (outbox_id bigint REFERENCES outbox_members (id))")
    conn.execute("INSERT INTO member_notes VALUES (%s)", (row_id,))  # the delete will be refused
    report = relay(db_url)
    assert (report.sent, report.dead) == (1, 0)
    row = rows(conn, TABLE)[0]
    assert (row["status"], row["last_error_code"]) == ("sent", "DB_ERROR")
    assert "could not record the outcome (deleted" in row["last_error"]
    assert conn.execute("SELECT count(*) AS n FROM automated_email_recipients").fetchone()["n"] == 1
