"""The on-call's rows: what died, the dead heads that block ordering keys, a message found by event id, key or
tenant across tables; newest first, the error's secrets masked, the blocked keys counted as the checks count them."""

from datetime import timedelta

import pytest

from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
from outbox_pipelines.core.oncall.message_rows import blocked_messages, dead_messages, find_messages
from outbox_pipelines.core.settings import CheckThresholds
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.helpers import db_now
from outbox_pipelines_tests.rows import make_dead, make_sent

EVENTS = "outbox_events"
OTHER = "billing_outbox"


def enqueue(conn, table: str, *messages: tuple[str, str | None, str | None]) -> dict[str, int]:
    """(event_id, ordering_key, tenant_id) triples, one transaction each: their row ids by event id."""
    outbox = Outbox(table)
    return {
        event_id: outbox.enqueue(
            conn,
            Message(topic="orders.placed", payload={"e": event_id}, event_id=event_id, ordering_key=key, tenant_id=t),
            outside_transaction=True,
        ).id
        for event_id, key, t in messages
    }


@pytest.fixture
def scene(conn):
    """Two keys blocked by dead heads (k1 with 2 waiting, k2 with 1), one unkeyed dead letter, a key whose dead
    head was skipped, and delivered and waiting messages; deaths at known times, newest first: u1, k2a, k1a."""
    ids = enqueue(
        conn,
        EVENTS,
        ("k1a", "k1", "acme"),
        ("k1b", "k1", "acme"),
        ("k1c", "k1", "acme"),
        ("k2a", "k2", "globex"),
        ("k2b", "k2", "globex"),
        ("u1", None, "acme"),
        ("s1", None, "acme"),
        ("p1", None, None),
        ("k3a", "k3", None),
    )
    now = db_now(conn)
    make_dead(
        conn,
        EVENTS,
        ids["k1a"],
        code="BAD_REQUEST",
        error="HTTP 400: bad field",
        attempts=1,
        at=now - timedelta(hours=3),
    )
    make_dead(conn, EVENTS, ids["k2a"], code="BROKER_5XX", error="HTTP 503", attempts=8, at=now - timedelta(hours=2))
    secret = "HTTP 401 from https://relay:hunter2secret@hooks.example.com/in?token=abcd1234 (Bearer eyJhbGci.tok3n)"
    make_dead(conn, EVENTS, ids["u1"], code="AUTH", error=secret, attempts=8, at=now - timedelta(hours=1))
    make_dead(conn, EVENTS, ids["k3a"], code="BAD_REQUEST", error="skipped", at=now - timedelta(hours=4))
    conn.execute(
        "UPDATE outbox_events SET ordering_skipped_at = now() - interval '4 hours' WHERE id = %s", (ids["k3a"],)
    )
    make_sent(conn, EVENTS, ids["s1"])
    return ids


def test_dead_messages_newest_death_first_with_their_error_and_what_waits_behind(conn, scene):
    dead = dead_messages(conn, EVENTS)
    assert [r.event_id for r in dead] == ["u1", "k2a", "k1a", "k3a"]
    k2a = dead[1]
    assert (k2a.table, k2a.id, k2a.topic, k2a.ordering_key, k2a.tenant_id) == (
        EVENTS,
        scene["k2a"],
        "orders.placed",
        "k2",
        "globex",
    )
    assert (k2a.status, k2a.attempts, k2a.error_code, k2a.error) == ("dead", 8, "BROKER_5XX", "HTTP 503")
    # The heads of blocked keys say how many wait behind them; an unkeyed or skipped dead message holds nothing.
    assert {r.event_id: r.waiting_behind for r in dead} == {"u1": 0, "k2a": 1, "k1a": 2, "k3a": 0}
    assert dead[0].at > dead[1].at > dead[2].at
    assert [r.event_id for r in dead_messages(conn, EVENTS, limit=2)] == ["u1", "k2a"]


def test_no_secret_of_an_error_text_is_shown(conn, scene):
    [u1] = [r for r in dead_messages(conn, EVENTS) if r.event_id == "u1"]
    assert u1.error is not None and "HTTP 401" in u1.error and "hooks.example.com" in u1.error
    for secret in ("hunter2secret", "abcd1234", "eyJhbGci.tok3n"):
        assert secret not in u1.error, u1.error


def test_blocked_keys_are_the_dead_heads_the_checks_count(conn, scene):
    blocked = blocked_messages(conn, EVENTS)
    assert [(r.event_id, r.ordering_key, r.waiting_behind, r.error_code) for r in blocked] == [
        ("k2a", "k2", 1, "BROKER_5XX"),
        ("k1a", "k1", 2, "BAD_REQUEST"),
    ]
    # The same rule as the blocked_keys check and `status`: as many keys, as many messages waiting behind them.
    status = read_status(OutboxTable(conn, EVENTS))
    assert status.blocked_keys == len(blocked) and status.blocked_messages == sum(r.waiting_behind for r in blocked)
    assert {k["id"] for k in status.blocked_oldest} == {r.id for r in blocked}
    check = {v.name: v for v in evaluate_checks(status, CheckThresholds())}["blocked_keys"]
    assert check.severity == "warn"
    # Skipping a head unblocks its key: it leaves the list, and the check's count with it.
    conn.execute("UPDATE outbox_events SET ordering_skipped_at = now() WHERE id = %s", (scene["k2a"],))
    assert [r.event_id for r in blocked_messages(conn, EVENTS)] == ["k1a"]
    assert read_status(OutboxTable(conn, EVENTS)).blocked_keys == 1


def test_find_by_event_id_key_or_tenant_across_tables_in_any_state(conn, scene):
    conn.execute("SELECT outbox_create_table(%s)", (OTHER,))
    other = enqueue(conn, OTHER, ("b1", "k1", "acme"), ("b2", None, "initech"))
    make_dead(conn, OTHER, other["b2"], code="NETWORK", error="connection refused")
    tables = [EVENTS, OTHER, "not_created_yet"]  # a declared table not in the database is passed over

    [s1] = find_messages(conn, tables, event_id="s1")
    assert (s1.table, s1.status, s1.waiting_behind) == (EVENTS, "sent", 0)
    [b2] = find_messages(conn, tables, event_id="b2")
    assert (b2.table, b2.status, b2.error) == (OTHER, "dead", "connection refused")
    assert find_messages(conn, tables, event_id="nope") == []

    by_key = find_messages(conn, tables, ordering_key="k1")
    assert {(r.table, r.event_id) for r in by_key} == {(EVENTS, "k1a"), (EVENTS, "k1b"), (EVENTS, "k1c"), (OTHER, "b1")}
    assert {r.event_id: r.waiting_behind for r in by_key}["k1a"] == 2
    assert [r.event_id for r in find_messages(conn, tables, ordering_key="k3")] == ["k3a"]  # a skipped head too

    acme = find_messages(conn, tables, tenant_id="acme")
    assert {r.event_id for r in acme} == {"k1a", "k1b", "k1c", "u1", "s1", "b1"}
    assert [r.at for r in acme] == sorted((r.at for r in acme), reverse=True)
    # Filters combine; the limit bounds the whole answer.
    assert [
        r.event_id
        for r in find_messages(conn, tables, ordering_key="k1", tenant_id="acme", limit=50)
        if r.table == OTHER
    ] == ["b1"]
    assert find_messages(conn, tables, event_id="k1a", tenant_id="globex") == []
    assert len(find_messages(conn, tables, tenant_id="acme", limit=2)) == 2


def test_a_missing_table_or_an_invalid_name_or_limit_is_refused(conn):
    with pytest.raises(UnknownTable, match="does not exist"):
        dead_messages(conn, "not_created_yet")
    with pytest.raises(ValueError, match="invalid outbox table name"):
        blocked_messages(conn, 'x"; DROP TABLE outbox_events; --')
    with pytest.raises(ValueError, match="positive whole number"):
        dead_messages(conn, EVENTS, limit=0)
    with pytest.raises(ValueError, match="event id, an ordering key or a tenant"):
        find_messages(conn, [EVENTS])
    assert conn.execute("SELECT count(*) AS n FROM outbox_events").fetchone()["n"] == 0
