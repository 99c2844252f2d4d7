"""The key-head rule (sql/queries/outbox.sql's key_head), as the maintenance schedule reads it: a blocked message
with nothing before it on its key (its release was missed) makes the requeue pass due; one behind its head does not.
"""

from outbox_pipelines import Message
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.operations.maintenance_due import requeue_due
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings


def test_a_blocked_message_makes_the_requeue_due_only_once_nothing_holds_its_key(conn):
    messages = [Message(topic="t", payload={"n": n}, event_id=f"k-{n}", ordering_key="k") for n in range(2)]
    head, behind = (r.id for r in Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True))
    tables = [events_settings()]
    assert conn.execute(f"SELECT ordering_blocked FROM {EVENTS} WHERE id = %s", (behind,)).fetchone()[
        "ordering_blocked"
    ]
    assert requeue_due(conn, tables) == {}  # waiting behind its head, as it should
    # The head went without releasing its key (a relay gone between its settle and the release).
    conn.execute(f"UPDATE {EVENTS} SET status = 'sent' WHERE id = %s", (head,))
    assert requeue_due(conn, tables) == {EVENTS: "an ordering key waits with nothing before it"}
