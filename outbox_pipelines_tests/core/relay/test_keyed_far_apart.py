"""Migration 0027: a keyed message whose key's previous message is far behind it is stored ready; the claim that finds
it behind its key's head after all marks it waiting, reads past it, and its key's release still lets it go in order."""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.relay import Relay, ordering
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, rows

EVENTS = "outbox_events"
FAR = 1001  # outbox_ordering_near() is 1,000 ids


def enqueue(conn, key: str | None, name: str, *, available_at: datetime | None = None) -> int:
    message = Message(topic="t", payload={"name": name}, event_id=name, ordering_key=key, available_at=available_at)
    return Outbox(EVENTS).enqueue(conn, message, outside_transaction=True).id


def skip_ids(conn, count: int) -> None:
    """The next message's id comes ``count`` after the last: as if that many messages went by meanwhile."""
    conn.execute(
        "SELECT setval(pg_get_serial_sequence('outbox_events', 'id'), (SELECT max(id) FROM outbox_events) + %s)",
        (count,),
    )


def blocked(conn) -> list[str]:
    return sorted(r["event_id"] for r in rows(conn, EVENTS, "ordering_blocked"))


def test_a_message_far_behind_its_key_s_last_is_stored_ready_and_a_near_or_dead_one_waits(conn):
    enqueue(conn, "a", "a1")
    skip_ids(conn, FAR)
    enqueue(conn, "a", "a2")  # a1 still holds the key, far back
    enqueue(conn, "a", "a3")  # right behind a2
    enqueue(conn, "d", "d1")
    conn.execute("UPDATE outbox_events SET status = 'dead' WHERE event_id = 'd1'")  # a parked head
    skip_ids(conn, FAR)
    enqueue(conn, "d", "d2")
    assert blocked(conn) == ["a3", "d2"]


@pytest.mark.parametrize("held", [True, False], ids=["held", "leased"])
def test_a_claim_marks_a_message_behind_its_held_head_waiting_and_the_release_lets_it_go(conn, db_url, held):
    table = OutboxTable(conn, EVENTS)
    enqueue(conn, "a", "a1")
    (head,) = table.claim("x", 10, 30)  # a1 in flight with relay x
    skip_ids(conn, FAR)
    enqueue(conn, "a", "a2")
    enqueue(conn, None, "u1")
    with psycopg.connect(db_url, autocommit=True) as other:
        claimer = OutboxTable(other, EVENTS)
        if held:
            with other.transaction():
                claimed = claimer.claim_held(10, 30)
        else:
            claimed = claimer.claim("y", 10, 30)
        assert [c.event_id for c in claimed] == ["u1"]  # a2 is not its key's head
        assert claimer.left_waiting == 1 and claimer.contended_keys == {"a"}
        assert blocked(conn) == ["a2"]  # out of the claim's way until a1 is settled
        again = claimer.claim("y", 10, 30)  # u1 again when it was held: that transaction settled nothing
        assert "a2" not in [c.event_id for c in again] and claimer.left_waiting == 0
    table.settle_sent("x", [head.id], [head.attempts], audit_code=m.AUDIT_SUCCESS)
    assert blocked(conn) == []
    assert [c.event_id for c in table.claim("x", 10, 30)] == ["a2"]


def test_a_head_delivered_while_its_next_message_is_marked_lets_it_go_once_the_claim_commits(conn, db_url):
    """The settle of a1 commits between the claim that marks a2 and that claim's commit: its release could not see
    the mark. The claimer releases the keys it marked once its transaction is over."""
    table = OutboxTable(conn, EVENTS)
    enqueue(conn, "a", "a1")
    (head,) = table.claim("x", 10, 30)
    skip_ids(conn, FAR)
    enqueue(conn, "a", "a2")
    with open_session(db_url) as relay_conn:
        claimer = OutboxTable(relay_conn, EVENTS)
        with relay_conn.transaction():
            assert claimer.claim_held(10, 30) == [] and claimer.left_waiting == 1
            table.settle_sent("x", [head.id], [head.attempts], audit_code=m.AUDIT_SUCCESS)  # its release: nothing
        assert blocked(conn) == ["a2"]  # marked behind a head that is gone
        assert ordering.release_contended(claimer, patient=False) == []
    assert blocked(conn) == []
    assert [c.event_id for c in table.claim("x", 10, 30)] == ["a2"]


def test_a_one_shot_relay_reads_past_a_full_batch_of_messages_behind_their_heads(conn, db_url):
    """Heads in backoff, their keys' next messages far behind them and stored ready, and the rest beyond: each claim
    of the batch size finds only messages behind their heads. The run delivers the rest, and ends with the keyed ones
    waiting, not with "nothing ready" after its first claim."""
    later = datetime.now(UTC) + timedelta(hours=1)
    keys = [f"k{n}" for n in range(30)]
    for key in keys:
        enqueue(conn, key, f"{key}-1", available_at=later)  # e.g. retrying after a failed attempt
    skip_ids(conn, FAR)
    for key in keys:
        enqueue(conn, key, f"{key}-2")
    for n in range(5):
        enqueue(conn, None, f"u{n}")
    destination = ScriptedDestination()
    settings = table_settings(EVENTS, mode="competing", batch_size=10, idle_sleep_s=0.01)
    report = Relay(db_url, settings, destination).run(once=True)
    assert sorted(msg.event_id for msg in destination.calls) == [f"u{n}" for n in range(5)]
    assert report.sent == 5
    assert blocked(conn) == sorted(f"{key}-2" for key in keys)
    with psycopg.connect(db_url, row_factory=dict_row) as check:
        ready = check.execute(
            "SELECT count(*) AS n FROM outbox_events WHERE status = 'pending' AND NOT ordering_blocked"
        ).fetchone()
    assert ready["n"] == len(keys)  # the heads, in backoff
