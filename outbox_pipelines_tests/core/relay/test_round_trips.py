"""The relay's statements per batch (bench/relay_fixed_costs.py counts them): what it writes once per run stays
once, a held batch settles without a savepoint, and a refused row is still settled on its own."""

import time

import psycopg
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.models import AUDIT_DB_ERROR
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.storage.paused_topics import BY_SETTINGS
from outbox_pipelines.core.storage.shared_tables import SharedTables
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, enqueue_n, statuses


def test_the_paused_topics_are_recorded_once_per_run_not_at_every_claim(db_url, conn, monkeypatch):
    enqueue_n(conn, EVENTS, 25, topic="order.created")
    recorded: list[dict[str, str]] = []
    record = SharedTables.record_paused_topics

    def counted(self, table_name, paused, **kwargs):
        recorded.append(dict(paused))
        return record(self, table_name, paused, **kwargs)

    monkeypatch.setattr(SharedTables, "record_paused_topics", counted)
    settings = events_settings(batch_size=5, paused_topics=["order.cancelled"])
    report = Relay(db_url, settings, ScriptedDestination()).run(once=True)
    assert report.sent == 25
    assert recorded == [{"order.cancelled": BY_SETTINGS}]  # six claims, one write
    assert set(SharedTables(conn).read_paused_topics(EVENTS)) == {"order.cancelled"}


def test_a_held_batch_whose_settle_is_refused_settles_the_other_rows_and_records_the_refused_one(db_url, conn):
    kept, *others = enqueue_n(conn, EVENTS, 4)
    # Something of the application's refers to one message's row: deleting it on success is refused.
    conn.execute(f"CREATE TABLE app_refs (message_id bigint REFERENCES {EVENTS} (id))")  # test's own names
    conn.execute("INSERT INTO app_refs VALUES (%s)", (kept,))
    settings = events_settings(claim="transaction", on_success="delete")
    report = Relay(db_url, settings, ScriptedDestination()).run(once=True)
    assert report.sent == 4 and report.db_errors == 1
    assert statuses(conn, EVENTS) == {"sent": 1}  # the others deleted, as the table says
    assert audit_codes(conn, EVENTS, kept)[-1] == AUDIT_DB_ERROR
    with psycopg.connect(db_url) as check:  # nothing left locked or in a transaction
        assert len(check.execute(f"SELECT id FROM {EVENTS} FOR UPDATE NOWAIT").fetchall()) == 1
    assert all(audit_codes(conn, EVENTS, other) for other in others)


@pytest.mark.parametrize("claim", ["auto", "transaction"])
def test_a_held_batch_settles_as_its_transactions_first_write_without_a_savepoint(db_url, conn, monkeypatch, claim):
    """A savepoint per batch was a round trip on the path a backlog waits on, and a subtransaction for the server:
    a held batch's settle is the first write of its transaction, and a refusal rolls that transaction back."""
    enqueue_n(conn, EVENTS, 12)
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def recorded(self, query, *args, **kwargs):
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", recorded)
    report = Relay(db_url, events_settings(claim=claim, batch_size=4), ScriptedDestination()).run(once=True)
    assert report.sent == 12 and report.db_errors == 0
    assert statuses(conn, EVENTS) == {"sent": 12}
    assert sum(query.startswith("BEGIN") for query in sent) >= 3  # three held batches
    assert not [query for query in sent if "SAVEPOINT" in query]


class Pipelined(ScriptedDestination):
    """A broker-like destination: the relay claims the next batch while this one is on the wire."""

    pipelined = True

    def deliver(self, messages):
        time.sleep(0.01)  # on the wire long enough for the next claim and the settle behind it
        return super().deliver(messages)


def test_a_pipelined_relay_settles_behind_the_next_claim_each_row_once_in_key_order(db_url, conn):
    """The settle of a batch delivered whole runs on the keeper's connection while the next claim runs on the
    relay's: every row ends sent with one audit row from sending, no lease lost, each key's messages in order."""
    messages = [Message(topic="t", payload={"n": i}, event_id=f"k{i}", ordering_key=f"key-{i % 3}") for i in range(30)]
    Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True)
    destination = Pipelined()
    report = Relay(db_url, events_settings(batch_size=4), destination).run(once=True)
    assert report.sent == 30 and report.conflicts == 0 and report.db_errors == 0
    assert statuses(conn, EVENTS) == {"sent": 30}
    for key in ("key-0", "key-1", "key-2"):
        delivered = [m.event_id for m in destination.calls if m.ordering_key == key]
        assert delivered == [m.event_id for m in messages if m.ordering_key == key]
    audited = conn.execute(
        "SELECT from_status, to_status, count(*) AS n FROM outbox_audit WHERE outbox_table = %s "
        "AND to_status = 'sent' GROUP BY 1, 2",
        (EVENTS,),
    ).fetchall()
    assert [(a["from_status"], a["n"]) for a in audited] == [("sending", 30)]


def test_a_settle_behind_that_loses_its_connection_gives_its_batch_back_and_the_run_goes_on(db_url, conn, monkeypatch):
    """The keeper's connection fails under a pipelined batch's settle: the relay recovers as for any database error,
    the batch delivered but not recorded goes back to pending at once and is delivered again, nothing strands."""
    enqueue_n(conn, EVENTS, 20)
    real, failed = LeaseKeeper.on_connection, []

    def failing_once(self, work):
        if not failed:
            failed.append(True)
            raise psycopg.OperationalError("the keeper's connection was lost (test)")
        return real(self, work)

    monkeypatch.setattr(LeaseKeeper, "on_connection", failing_once)
    destination = Pipelined()
    report = Relay(db_url, events_settings(batch_size=4), destination).run(once=True)
    assert failed and report.db_errors == 1
    assert statuses(conn, EVENTS) == {"sent": 20}
    assert {m.event_id for m in destination.calls} == {f"e{i}" for i in range(20)}
    assert len(destination.calls) >= 24  # the batch whose settle was lost went out again
