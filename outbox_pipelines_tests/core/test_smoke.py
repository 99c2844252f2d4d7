from outbox_pipelines import Message, Outbox


def test_enqueue_then_read(conn):
    result = Outbox("outbox_events").enqueue(conn, Message(topic="t", payload={"a": 1}, event_id="e1"))
    assert result.duplicate is False
    row = conn.execute("SELECT status, payload, payload_sha FROM outbox_events WHERE id = %s", (result.id,)).fetchone()
    assert row["status"] == "pending"
    assert row["payload"] == {"a": 1}
    assert row["payload_sha"].startswith("sha256:")
