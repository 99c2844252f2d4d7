"""A running relay tries the keys a settle could not release at most every CONTENDED_EVERY_S (issue 47): a
key held by another relay's settle waits a moment for the next try, never for the sweep."""

import psycopg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.relay import ordering
from outbox_pipelines.core.storage.table import OutboxTable, Settlement
from outbox_pipelines_tests.helpers import rows

EVENTS = "outbox_events"


def _blocked(conn) -> list[str]:
    return sorted(r["event_id"] for r in rows(conn, EVENTS, "ordering_blocked"))


def _held_key(db_url, conn, holder: psycopg.Connection) -> OutboxTable:
    """a1 delivered while ``holder`` holds key a's stripe (as another relay's settle does): a2 still waits."""
    outbox = Outbox(EVENTS)
    for name in ("a1", "a2"):
        outbox.enqueue(conn, Message(topic="t", payload={}, event_id=name, ordering_key="a"), outside_transaction=True)
    table = OutboxTable(conn, EVENTS)
    [a1] = table.claim("w", 10, 30)
    holder.execute(
        "SELECT pg_advisory_xact_lock(outbox_ordering_lock_space(%s), outbox_ordering_stripe('a'))", (EVENTS,)
    )
    table.settle("w", [Settlement(a1.id, a1.attempts, "sent", m.AUDIT_SUCCESS, ref="ok")])
    assert table.contended_keys == {"a"} and _blocked(conn) == ["a2"]
    return table


def test_a_running_relay_tries_a_held_key_again_once_the_interval_has_passed(db_url, conn):
    now = [100.0]
    with psycopg.connect(db_url) as holder:
        table = _held_key(db_url, conn, holder)
        assert ordering.release_contended(table, patient=False, clock=lambda: now[0]) == ["a"]  # tried: held
        holder.rollback()  # the other settle committed
        now[0] += ordering.CONTENDED_EVERY_S / 2
        # Within the interval: no statement, the key stays for the next try.
        assert ordering.release_contended(table, patient=False, clock=lambda: now[0]) == ["a"]
        assert _blocked(conn) == ["a2"]
        now[0] += ordering.CONTENDED_EVERY_S
        assert ordering.release_contended(table, patient=False, clock=lambda: now[0]) == []
    assert _blocked(conn) == [] and table.contended_keys == set()
    assert [msg.event_id for msg in table.claim("w", 10, 30)] == ["a2"]


def test_a_relay_that_ends_releases_at_once_whatever_the_interval(db_url, conn):
    now = [100.0]
    with psycopg.connect(db_url) as holder:
        table = _held_key(db_url, conn, holder)
        assert ordering.release_contended(table, patient=False, clock=lambda: now[0]) == ["a"]
        holder.rollback()
        assert ordering.release_contended(table, clock=lambda: now[0]) == []  # patient: the relay's end
    assert _blocked(conn) == []
