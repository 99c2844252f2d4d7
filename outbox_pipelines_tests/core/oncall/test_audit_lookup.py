"""The audit lookups docs/how-to/on-call.md gives the on-call engineer find a message's rows, and only its
rows, when two outbox tables hold messages of the same id; the one through the message's row uses the
audit's index by message id (migration 0012)."""

import re

from outbox_pipelines import Outcome
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.conftest import REPO, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, enqueue_n

ON_CALL = REPO / "docs" / "how-to" / "on-call.md"


def _documented_queries() -> tuple[str, str]:
    """The two lookups of the on-call page, as an engineer copies them."""
    text = " ".join(ON_CALL.read_text(encoding="utf-8").split())
    through_row = re.search(r"`(SELECT a\.\* FROM outbox_orders AS o JOIN outbox_audit [^`]+)`", text)
    by_event = re.search(r"`(SELECT \* FROM outbox_audit WHERE outbox_table = 'outbox_orders' [^`]+)`", text)
    assert through_row and by_event, f"{ON_CALL} no longer gives the two audit lookups"
    return through_row.group(1), by_event.group(1)


def _with_event(query: str) -> str:
    """The documented query with its event id as a parameter."""
    assert query.count("'...'") == 1, query
    return query.replace("'...'", "%s")


def test_the_on_call_lookups_find_one_messages_audit_rows(db_url, conn):
    # Same ids in two tables: the first message of each is id 1.
    enqueue_n(conn, "outbox_orders", 3, prefix="ord-")
    enqueue_n(conn, "outbox_events", 3, prefix="ev-")
    retried = {"ord-1": 0}

    def once_retried(msg):
        if msg.event_id in retried and retried[msg.event_id] == 0:
            retried[msg.event_id] += 1
            return Outcome.retry("E_TEMPORARY", "try again", delay_s=0)
        return Outcome.sent(ref=f"ref-{msg.id}")

    for table in ("outbox_orders", "outbox_events"):
        settings = table_settings(table, mode="competing", idle_sleep_s=0.01)
        report = Relay(db_url, settings, ScriptedDestination(once_retried)).run(once=True)
        assert report.sent == 3, report

    through_row, by_event = _documented_queries()
    found = conn.execute(_with_event(through_row), ("ord-1",)).fetchall()
    assert [(r["outbox_table"], r["event_id"], r["to_status"]) for r in found] == [
        ("outbox_orders", "ord-1", "pending"),
        ("outbox_orders", "ord-1", "sent"),
    ], found
    assert found[0]["code"] != found[1]["code"]
    assert conn.execute(_with_event(by_event), ("ord-1",)).fetchall() == found

    # The lookup through the row reads the audit by its index on message_id, not the whole audit.
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r["QUERY PLAN"] for r in conn.execute("EXPLAIN " + _with_event(through_row), ("ord-1",)))
    assert "outbox_audit_by_message" in plan, plan


def test_the_audit_has_no_b_tree_that_every_delivery_would_pay_for(conn):
    indexes = {
        r["indexname"]: r["indexdef"]
        for r in conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'outbox_audit'")
    }
    assert "USING brin (message_id int8_minmax_multi_ops)" in indexes.pop("outbox_audit_by_message")
    assert "USING brin (created_at)" in indexes.pop("outbox_audit_by_time")
    assert list(indexes) == ["outbox_audit_pkey"], indexes  # the identity key, written in order
