"""Which of the relay's statements keep their plan (prepared, generic) and which are planned anew each time.

Parsing and planning the claim or the settle anew cost about 1 ms each a batch, and their generic plans run as
fast as planned ones at every batch size: they keep theirs. The general settle (retries, deaths) is planned for
its parameters each time. Nothing is prepared just because it ran often. A kept plan reads about a batch whatever
statistics it was made with: a quiet queue's, an emptied queue's, a new table's.
"""

from collections.abc import Callable

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core import models as m
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.settlements import Settlement, SettleStatus
from outbox_pipelines.core.storage.shared_tables import SharedTables
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.core.relay.events import EVENTS
from outbox_pipelines_tests.helpers import enqueue_n, statuses


def kept_plans(conn) -> dict[str, tuple[int, int]]:
    """The session's prepared statements, by the query name in their text: (generic runs, custom runs)."""
    rows = conn.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements").fetchall()
    found: dict[str, tuple[int, int]] = {}
    for row in rows:
        for name, marker in (
            ("claim", "-- outbox_claim\n"),
            ("held claim", "-- outbox_claim_held\n"),
            ("settle", "-- outbox_settle_sent"),
            ("next due", "AS next_due_in_s"),
        ):
            if marker in row["statement"]:
                generic, custom = found.get(name, (0, 0))
                found[name] = (generic + row["generic_plans"], custom + row["custom_plans"])
    return found


def test_claims_and_delivered_settles_keep_a_generic_plan_at_every_size(db_url, conn):
    enqueue_n(conn, EVENTS, 1 + 300 + 3)
    with open_session(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        for _ in range(3):  # run often, but never asked to keep a plan: planned anew each time
            table.claim("w", 0, 60)
        assert kept_plans(relay_conn) == {}
        for size in (1, 300):  # a trickle, then a backlog: the same plan
            claimed = table.claim("w", size, 60, reuse_plan=True)
            table.settle_sent("w", [c.id for c in claimed], [c.attempts for c in claimed], audit_code=m.AUDIT_SUCCESS)
            table.next_due_in_s()
        assert kept_plans(relay_conn) == {"claim": (2, 0), "settle": (2, 0), "next due": (2, 0)}
        # A batch with a retry in it goes through the general settle: not prepared.
        claimed = table.claim("w", 3, 60, reuse_plan=True)
        retry = Settlement(claimed[0].id, claimed[0].attempts, SettleStatus.PENDING, m.AUDIT_RETRY, error="503")
        sent = [Settlement(c.id, c.attempts, SettleStatus.SENT, m.AUDIT_SUCCESS) for c in claimed[1:]]
        assert table.settle("w", [retry, *sent]) == {c.id for c in claimed}
        assert kept_plans(relay_conn) == {"claim": (3, 0), "settle": (2, 0), "next due": (2, 0)}
        assert relay_conn.execute("SHOW enable_seqscan").fetchone()["enable_seqscan"] == "off"
    assert statuses(conn, EVENTS) == {"sent": 1 + 300 + 2, "pending": 1}


def rows_fetched(conn, table: str) -> int:
    """Rows the open transaction has read from ``table`` through its indexes so far."""
    row = conn.execute("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = %s", (table,)).fetchone()
    return int(row["idx_tup_fetch"])


def test_a_kept_claim_plan_reads_a_batch_not_the_whole_backlog_of_a_one_topic_table(db_url, conn):
    """A table of one topic, its statistics fresh: its kept claim plans read about a batch of rows, not every due
    one (they once expected no row to pass the paused-topics test and sorted the whole backlog for each claim)."""
    enqueue_n(conn, EVENTS, 3000)
    conn.execute(f"ANALYZE {EVENTS}")
    with open_session(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        with relay_conn.transaction():
            assert len(table.claim_held(100, 60, gated=True, reuse_plan=True)) == 100
            held_read = rows_fetched(relay_conn, EVENTS)
        with relay_conn.transaction():
            assert len(table.claim("w", 100, 60, gated=True, reuse_plan=True)) == 100
            leased_read = rows_fetched(relay_conn, EVENTS)
        assert kept_plans(relay_conn)["claim"] == (1, 0)  # the leased claim ran its generic plan
    assert held_read < 500 and leased_read < 500, (held_read, leased_read)


def claim_kept(table: OutboxTable, leased: bool) -> list:
    """A relay's claim of 100 with its kept plan: leased, or held in the open transaction."""
    if leased:
        return table.claim("w", 100, 60, gated=True, reuse_plan=True)
    return table.claim_held(100, 60, gated=True, reuse_plan=True)


def reads_of_kept_plans(db_url: str, leased: bool, burst: Callable[[], object]) -> tuple[list[int], list[int]]:
    """A relay session makes its plans on the table as it is now (one empty claim), then ``burst`` arrives: the rows
    each of 3 claims of 100 read from the table with those plans, and each of their settles (each batch delivered,
    so that the next claim takes the next message of each key)."""
    reads: list[int] = []
    settle_reads: list[int] = []
    with open_session(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        with relay_conn.transaction():  # planned now, and kept
            assert claim_kept(table, leased) == []
        burst()
        for _ in range(3):
            with relay_conn.transaction():
                # pg_stat_xact_user_tables counts what the session read and has not reported yet too
                before = rows_fetched(relay_conn, EVENTS)
                claimed = claim_kept(table, leased)
                reads.append(rows_fetched(relay_conn, EVENTS) - before)
                assert len(claimed) == 100
                before = rows_fetched(relay_conn, EVENTS)
                ids, attempts = [c.id for c in claimed], [c.attempts for c in claimed]
                table.settle_sent("w", ids, attempts, audit_code=m.AUDIT_SUCCESS, held=not leased)
                settle_reads.append(rows_fetched(relay_conn, EVENTS) - before)
        generic, custom = kept_plans(relay_conn)["claim" if leased else "held claim"]
        assert generic == 4 and custom == 0  # the plan made before the burst ran
    return reads, settle_reads


@pytest.mark.parametrize("leased", [False, True], ids=["held", "leased"])
@pytest.mark.parametrize("pending_at_analyze", [10, 300])
def test_a_kept_claim_plan_made_on_a_quiet_queue_reads_a_batch_of_the_burst_that_follows(
    db_url, conn, leased, pending_at_analyze
):
    """A queue that keeps up holds a few pending rows when its statistics are taken. A claim plan kept from then
    read every due row of the next burst and sorted them, for each claim (through pending_by_available, or the
    whole of ready_by_id into a bitmap): a burst drained in quadratic time. Each claim reads about a batch."""
    for round_ in range(3):  # a queue in use: sent rows cleaned, their space filled by new rows in no id order
        enqueue_n(conn, EVENTS, 2000, prefix=f"old{round_}-")
        conn.execute(f"UPDATE {EVENTS} SET status = 'sent', published_at = now()")
        conn.execute(f"DELETE FROM {EVENTS} WHERE id % 3 <> 0")
        conn.execute(f"VACUUM {EVENTS}")
    kept_pending = enqueue_n(conn, EVENTS, 3000)[pending_at_analyze - 1]
    conn.execute(f"UPDATE {EVENTS} SET status = 'sent', published_at = now() WHERE id > %s", (kept_pending,))
    conn.execute(f"VACUUM ANALYZE {EVENTS}")
    conn.execute(f"UPDATE {EVENTS} SET status = 'sent', published_at = now() WHERE status = 'pending'")
    reads, settle_reads = reads_of_kept_plans(db_url, leased, lambda: enqueue_n(conn, EVENTS, 6000, prefix="burst-"))
    assert max(reads) < 600, reads
    assert max(settle_reads) < 600, settle_reads


@pytest.mark.parametrize("leased", [False, True], ids=["held", "leased"])
def test_a_claim_while_the_destination_is_paused_reads_none_of_the_backlog(db_url, conn, leased):
    """A 429 paused the destination: the claim gives nothing, and reads nothing for it (it once read every due row
    and kept none, for each claim of a relay waiting out the pause beside a backlog)."""
    enqueue_n(conn, EVENTS, 3000)
    conn.execute(f"ANALYZE {EVENTS}")
    SharedTables(conn).pause_destination(EVENTS, destination="paper", delay_s=600, reason="429 Too Many Requests")
    with open_session(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        for _ in range(2):
            with relay_conn.transaction():
                before = rows_fetched(relay_conn, EVENTS)
                assert claim_kept(table, leased) == []
                assert rows_fetched(relay_conn, EVENTS) - before == 0
    assert statuses(conn, EVENTS) == {"pending": 3000}


def keyed_messages(count: int, keys: int, prefix: str) -> list[Message]:
    return [
        Message(topic="t", payload={"n": n}, event_id=f"{prefix}{n}", ordering_key=f"key-{n % keys}")
        for n in range(count)
    ]


@pytest.mark.parametrize("leased", [False, True], ids=["held", "leased"])
def test_a_kept_keyed_claim_plan_made_on_an_emptied_queue_probes_each_key_not_the_table(db_url, conn, leased):
    """A keyed queue analyzed full, then sent and cleaned out (its statistics describe it full, its size says empty):
    a relay started then keeps the claim plan it makes. Its key-head probe (is there an earlier message of this key?)
    once went through the primary key and read every earlier row of the table for each row claimed, so that a keyed
    backlog's claims grew with it. Each claim reads about its batch's keys."""
    outbox = Outbox(EVENTS)
    outbox.enqueue_many(conn, keyed_messages(3000, 100, "old-"), outside_transaction=True)
    conn.execute(f"ANALYZE {EVENTS}")
    conn.execute(f"DELETE FROM {EVENTS}")
    conn.execute(f"VACUUM {EVENTS}")
    reads, settle_reads = reads_of_kept_plans(
        db_url, leased, lambda: outbox.enqueue_many(conn, keyed_messages(3000, 100, "new-"), outside_transaction=True)
    )
    assert max(reads) < 1000, reads
    assert max(settle_reads) < 1000, settle_reads
