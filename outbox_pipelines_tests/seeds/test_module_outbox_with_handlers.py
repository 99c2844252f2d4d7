"""Seed 004 end to end: a <module>_outbox written with the business row, a handler dispatcher, the
single-active relay, max attempts and the cleaner's retention."""

import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from outbox_pipelines import HandlerRegistry, Message, Outbox, RetryPolicy
from outbox_pipelines.core.destinations import HandlerDestination
from outbox_pipelines.core.operations.maintenance import clean
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage import schema
from outbox_pipelines.core.storage.db import sqlalchemy_url
from outbox_pipelines_tests.helpers import db_now, rows, statuses
from outbox_pipelines_tests.rows import make_due, make_sent

TABLE = "org_outbox"


@pytest.fixture
def org_outbox(db_url):
    schema.create_table(db_url, TABLE)
    return TABLE


def settings(**overrides) -> TableSettings:
    base = dict(
        name=TABLE,
        destination="handlers",
        mode="single-active",
        idle_sleep_s=0.02,
        poll_interval_s=0.05,
        retry=RetryPolicy(base_s=60, max_s=60, max_attempts=3, jitter=0),
    )
    return TableSettings(**{**base, **overrides})


def test_enqueue_in_the_business_transaction_and_duplicate_event_ids(db_url, conn, org_outbox):
    conn.execute("CREATE TABLE orgs (id int PRIMARY KEY, name text)")
    engine = sa.create_engine(sqlalchemy_url(db_url))
    outbox = Outbox(TABLE)
    with engine.begin() as tx:
        tx.execute(sa.text("INSERT INTO orgs VALUES (1, 'acme')"))
        first = outbox.enqueue(
            tx, Message(topic="org.changed", payload={"org_id": 1}, event_id="org-1-v1", tenant_id="t1")
        )
    with pytest.raises(sa.exc.IntegrityError):
        with engine.begin() as tx:
            outbox.enqueue(tx, Message(topic="org.changed", payload={"org_id": 1}, event_id="org-1-v2"))
            tx.execute(sa.text("INSERT INTO orgs VALUES (1, 'dup')"))  # the business write fails: all rolls back
    with engine.begin() as tx:
        again = outbox.enqueue(tx, Message(topic="org.changed", payload={"org_id": 1}, event_id="org-1-v1"))
    engine.dispose()
    assert (again.id, again.duplicate) == (first.id, True)  # the existing row's sequence
    assert [r["event_id"] for r in rows(conn, TABLE)] == ["org-1-v1"]


def test_dispatcher_aggregates_handler_errors_and_never_drops_unrouted_messages(db_url, conn, org_outbox):
    registry = HandlerRegistry()
    registry.register("org.changed", lambda msg: "cache-flushed")
    registry.register("org.changed", lambda msg: (_ for _ in ()).throw(RuntimeError("search index down")))
    registry.register("org.changed", lambda msg: (_ for _ in ()).throw(ValueError("webhook 500")))
    Outbox(TABLE).enqueue(
        conn, Message(topic="org.changed", payload={"org_id": 1}, event_id="e1"), outside_transaction=True
    )
    Outbox(TABLE).enqueue(
        conn, Message(topic="org.deleted", payload={"org_id": 2}, event_id="e2"), outside_transaction=True
    )
    Relay(db_url, settings(), HandlerDestination(registry)).run(once=True)
    by_event = {r["event_id"]: r for r in rows(conn, TABLE)}
    changed, deleted = by_event["e1"], by_event["e2"]
    assert changed["last_error_code"] == "HANDLER_ERROR"
    assert "2 of 3 handlers failed" in changed["last_error"]
    assert "search index down" in changed["last_error"] and "webhook 500" in changed["last_error"]
    assert (deleted["status"], deleted["last_error_code"]) == ("pending", "NO_SUBSCRIBERS")


def test_max_attempts_stops_retrying_and_the_row_stays_queryable(db_url, conn, org_outbox):
    registry = HandlerRegistry()
    registry.register("org.changed", lambda msg: (_ for _ in ()).throw(RuntimeError("always")))
    Outbox(TABLE).enqueue(conn, Message(topic="org.changed", payload={}, event_id="e"), outside_transaction=True)
    for _ in range(4):
        make_due(conn, TABLE)
        Relay(db_url, settings(), HandlerDestination(registry)).run(once=True)
    [row] = rows(conn, TABLE)
    assert (row["status"], row["attempts"]) == ("dead", 3)


def test_single_active_relay_one_at_a_time_and_a_standby_takes_over(db_url, conn, org_outbox):
    registry = HandlerRegistry()
    seen: list[str] = []
    registry.register("t", lambda msg: seen.append(threading.current_thread().name))
    first = Relay(db_url, settings(), HandlerDestination(registry), worker_id="first")
    second = Relay(db_url, settings(), HandlerDestination(registry), worker_id="second")
    t1 = threading.Thread(target=first.run, kwargs={"max_seconds": 10}, name="first")
    t1.start()
    time.sleep(0.3)  # let the first take the lock
    result = {}
    t2 = threading.Thread(target=lambda: result.update(report=second.run(max_seconds=10)), name="second")
    t2.start()
    for n in range(5):
        Outbox(TABLE).enqueue(conn, Message(topic="t", payload={"n": n}, event_id=f"a{n}"), outside_transaction=True)
    deadline = time.monotonic() + 5
    while statuses(conn, TABLE) != {"sent": 5} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(seen) == {"first"}  # only the lock holder relayed
    first.request_stop()
    t1.join(10)
    for n in range(5, 8):
        Outbox(TABLE).enqueue(conn, Message(topic="t", payload={"n": n}, event_id=f"a{n}"), outside_transaction=True)
    deadline = time.monotonic() + 5
    while statuses(conn, TABLE) != {"sent": 8} and time.monotonic() < deadline:
        time.sleep(0.05)
    second.request_stop()
    t2.join(10)
    assert seen.count("second") == 3
    assert result["report"].lock_held is True


def test_cleaner_retention_keeps_unpublished_and_recent_rows(db_url, conn, org_outbox):
    for n in range(4):
        Outbox(TABLE).enqueue(conn, Message(topic="t", payload={}, event_id=f"c{n}"), outside_transaction=True)
    now = db_now(conn)
    make_sent(conn, TABLE, event_ids=["c0", "c1"], published_at=now - timedelta(hours=169))
    make_sent(conn, TABLE, event_ids=["c2"], published_at=now - timedelta(hours=1))
    report = clean(db_url, settings(), retention_s=168 * 3600)
    assert report.deleted_sent == 2
    assert sorted(r["event_id"] for r in rows(conn, TABLE)) == ["c2", "c3"]
