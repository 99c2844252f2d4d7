"""A batch settle the database refuses (a team's own trigger on the outbox table) is settled row by row: the refused
row ends as a database error, the rest of the batch as delivered, in each claim mode (a held batch's settle has no
savepoint: its refusal rolls the batch's transaction back, and the rows are settled one by one)."""

import pytest

from outbox_pipelines.core import models as m
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, enqueue_n, statuses

REFUSE_BAD_SENT = """
CREATE FUNCTION refuse_bad_sent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.event_id = 'bad' AND NEW.status = 'sent' AND NEW.last_error_code IS NULL THEN
        RAISE EXCEPTION 'the team''s rule refuses this row';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_bad_sent BEFORE UPDATE ON outbox_events FOR EACH ROW EXECUTE FUNCTION refuse_bad_sent();
"""


@pytest.mark.parametrize("claim", ["auto", "transaction", "lease"])
def test_a_refused_batch_settle_goes_row_by_row_and_the_rest_is_delivered(db_url, conn, claim):
    conn.execute(REFUSE_BAD_SENT)
    ids = enqueue_n(conn, EVENTS, 4)
    conn.execute("UPDATE outbox_events SET event_id = 'bad' WHERE id = %s", (ids[1],))
    report = Relay(db_url, events_settings(claim=claim, batch_size=10), ScriptedDestination()).run(once=True)
    assert report.sent == 4 and report.db_errors == 1
    assert statuses(conn, EVENTS) == {"sent": 4}
    assert audit_codes(conn, EVENTS, ids[1])[-1] == m.AUDIT_DB_ERROR
    assert audit_codes(conn, EVENTS, ids[0])[-1] == m.AUDIT_SUCCESS
    marked = conn.execute("SELECT id FROM outbox_events WHERE last_error_code IS NOT NULL").fetchall()
    assert [row["id"] for row in marked] == [ids[1]]
