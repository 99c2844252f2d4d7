"""Which of the relay's statements keep their plan (prepared) and which are planned anew each time.

Planning the claim or the settle costs 0.4-0.5 ms, a third of a message's way at a trickle, so a
statement over a few rows keeps its plan; a big batch is planned for its own size (a generic plan
of the batched settle is quadratic in it). Nothing is prepared just because it ran often.
"""

from outbox_pipelines.core import models as m
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.table import PLAN_REUSE_MAX_ROWS, OutboxTable
from outbox_pipelines_tests.core.relay.events import EVENTS
from outbox_pipelines_tests.helpers import enqueue_n, statuses


def kept_plans(conn) -> dict[str, int]:
    """The session's prepared statements, by the query name in their text: how often each ran."""
    rows = conn.execute("SELECT statement, generic_plans + custom_plans AS runs FROM pg_prepared_statements").fetchall()
    found: dict[str, int] = {}
    for row in rows:
        for name, marker in (
            ("claim", "'outbox_claim'"),
            ("settle", "SET status = 'sent'"),
            ("next due", "AS next_due_in_s"),
        ):
            if marker in row["statement"]:
                found[name] = found.get(name, 0) + row["runs"]
    return found


def test_small_statements_keep_their_plan_and_big_batches_are_planned_for_their_size(db_url, conn):
    big = PLAN_REUSE_MAX_ROWS + 4
    enqueue_n(conn, EVENTS, big + 6)
    with open_session(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        for _ in range(8):  # run often, but never asked to keep a plan: planned anew each time
            table.claim("w", 0, 60)
        claimed = table.claim("w", big, 60)
        table.settle_sent("w", [c.id for c in claimed], [c.attempts for c in claimed], audit_code=m.AUDIT_SUCCESS)
        assert kept_plans(relay_conn) == {}
        for _ in range(6):  # a trickle: one message at a time, each statement's plan kept
            (one,) = table.claim("w", 1, 60, reuse_plan=True)
            table.settle_sent("w", [one.id], [one.attempts], audit_code=m.AUDIT_SUCCESS)
            table.next_due_in_s()
        assert kept_plans(relay_conn) == {"claim": 6, "settle": 6, "next due": 6}
        assert relay_conn.execute("SHOW enable_seqscan").fetchone()["enable_seqscan"] == "off"
    assert statuses(conn, EVENTS) == {"sent": big + 6}
