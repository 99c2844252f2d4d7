"""The settles' array parameters are text literals (storage/array_literals.py): whatever a destination answers
(quotes, backslashes, braces, commas, the word NULL, new lines, any script) reaches the row and its audit exactly
as given, and a missing value stays NULL."""

import pytest

from outbox_pipelines.core import models as m
from outbox_pipelines.core.storage.array_literals import bigint_array, text_array
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.settlements import Settlement, SettleStatus
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.core.relay.events import EVENTS
from outbox_pipelines_tests.helpers import enqueue_n

AWKWARD = [
    'a "quoted" ref',
    "back\\slash\\",
    "{braces},commas",
    "NULL",
    "",
    "  spaced  ",
    "line\nbreak\ttab",
    '\\"',
    "日本語 / 中文 ✓",
    None,
]


def test_the_literals_read_back_as_the_values_given(conn):
    texts = conn.execute("SELECT %s::text[] AS v", (text_array(AWKWARD),)).fetchone()["v"]
    assert texts == AWKWARD
    assert conn.execute("SELECT %s::text[] AS v", (text_array([]),)).fetchone()["v"] == []
    numbers = [1, -2, 2**62, 0]
    assert conn.execute("SELECT %s::bigint[] AS v", (bigint_array(numbers),)).fetchone()["v"] == numbers


def test_a_value_that_is_not_text_is_refused_before_any_statement():
    with pytest.raises(TypeError, match="str or None, not int"):
        text_array(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        bigint_array(["1; DROP TABLE x"])  # type: ignore[list-item]


def test_awkward_references_and_errors_are_settled_exactly(db_url, conn):
    refs = [r if r is None else f"ref {r}" for r in AWKWARD]
    ids = enqueue_n(conn, EVENTS, len(refs) + 2)
    with connect(db_url) as relay_conn:
        table = OutboxTable(relay_conn, EVENTS)
        claimed = {c.id: c for c in table.claim("w", len(ids), 60)}
        sent = ids[: len(refs)]
        assert table.settle_sent(
            "w", sent, [claimed[i].attempts for i in sent], audit_code=m.AUDIT_SUCCESS, refs=refs
        ) == set(sent)
        # The general settle (a retry and a dead letter beside a delivery): its text arrays are literals too.
        retry, dead = ids[-2:]
        error = 'HTTP 500: {"detail": "a \\"quoted\\" NULL, with commas"}'
        outcomes = [
            Settlement(
                retry,
                claimed[retry].attempts,
                SettleStatus.PENDING,
                m.AUDIT_RETRY,
                error_code="HTTP_500",
                error=error,
                delay_s=30.0,
            ),
            Settlement(
                dead, claimed[dead].attempts, SettleStatus.DEAD, m.AUDIT_DEAD, error_code="BAD,CODE", error="NULL"
            ),
        ]
        assert table.settle("w", outcomes) == {retry, dead}
    rows = {r["id"]: r for r in conn.execute(f"SELECT * FROM {EVENTS} WHERE id = ANY(%s)", (ids,))}
    assert [rows[i]["result_ref"] for i in sent] == refs
    assert (rows[retry]["status"], rows[retry]["last_error"], rows[retry]["last_error_code"]) == (
        "pending",
        error,
        "HTTP_500",
    )
    assert (rows[dead]["status"], rows[dead]["last_error"], rows[dead]["last_error_code"]) == (
        "dead",
        "NULL",
        "BAD,CODE",
    )
    details = {
        r["message_id"]: r["detail"]
        for r in conn.execute(
            "SELECT message_id, detail FROM outbox_audit WHERE outbox_table = %s AND to_status = 'sent'", (EVENTS,)
        )
    }
    assert [details[i] for i in sent] == [None if r is None else f"ref={r}" for r in refs]
