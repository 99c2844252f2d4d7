"""outbox_settle_sent pairs each row with its input by runs of consecutive ids: a batch in any order, with gaps and
mixed attempts, settles each row at its own attempt with its own reference, and a row whose attempt is stale is
left as it is and audited as a conflict."""

from outbox_pipelines.core import models as m
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.core.storage.table_claims import id_runs
from outbox_pipelines_tests.core.relay.events import EVENTS
from outbox_pipelines_tests.helpers import enqueue_n


def test_runs_cover_each_id_once_at_its_place():
    ids, attempts = [7, 8, 9, 3, 4, 20, 21], [1, 1, 2, 1, 1, 1, 1]
    first, last, run_attempts, at = id_runs(ids, attempts)
    assert (first, last, run_attempts, at) == ([7, 9, 3, 20], [8, 9, 4, 21], [1, 2, 1, 1], [1, 3, 4, 6])
    for start, end, attempt, place in zip(first, last, run_attempts, at, strict=True):
        for row_id in range(start, end + 1):
            assert ids[place - 1 + row_id - start] == row_id
            assert attempts[place - 1 + row_id - start] == attempt


def test_a_scattered_batch_settles_each_row_with_its_own_attempt_and_reference(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 8)
    with connect(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        claimed = {c.id: c for c in table.claim("w", 8, 60)}
        assert sorted(claimed) == sorted(ids)
        # Out of id order, with gaps (ids[2] and ids[5] are left leased), and one stale attempt (ids[7]).
        chosen = [ids[6], ids[0], ids[1], ids[7], ids[4], ids[3]]
        attempts = [claimed[i].attempts for i in chosen]
        attempts[3] += 1  # no longer this relay's attempt: the fence refuses it
        refs = [f"ref-{i}" for i in chosen]
        settled = table.settle_sent("w", chosen, attempts, audit_code=m.AUDIT_SUCCESS, refs=refs)
    assert settled == set(chosen) - {ids[7]}
    found = {
        r["id"]: r
        for r in conn.execute(f"SELECT id, status, attempts, result_ref FROM {EVENTS} WHERE id = ANY(%s)", (ids,))
    }
    for row_id in set(chosen) - {ids[7]}:
        assert (found[row_id]["status"], found[row_id]["result_ref"]) == ("sent", f"ref-{row_id}")
        assert found[row_id]["attempts"] == claimed[row_id].attempts
    for row_id in (ids[2], ids[5], ids[7]):
        assert found[row_id]["status"] == "sending"
    audit = conn.execute(
        "SELECT message_id, code, detail, attempts FROM outbox_audit WHERE outbox_table = %s AND to_status = 'sent'",
        (EVENTS,),
    ).fetchall()
    sent_audit = {a["message_id"]: a for a in audit if a["code"] == m.AUDIT_SUCCESS}
    assert sorted(sent_audit) == sorted(set(chosen) - {ids[7]})
    assert all(a["detail"] == f"ref=ref-{i}" for i, a in sent_audit.items())
    conflicts = [a for a in audit if a["code"] == "outbox_flush_conflict"]
    assert [(a["message_id"], a["attempts"]) for a in conflicts] == [(ids[7], claimed[ids[7]].attempts + 1)]
