"""docs/how-to/inbox.md's one pattern, run as the page writes it: receive, act, publish the follow-up event with
``Outbox.enqueue``, in one transaction. A repeat changes nothing; a failure after the enqueue leaves nothing."""

import re
from pathlib import Path

import pytest

from outbox_pipelines.core.storage import schema
from outbox_pipelines.core.storage.db import sqlalchemy_url

PAGE = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "inbox.md"
PLACEHOLDER = "postgresql+psycopg://app@localhost/app"


@pytest.fixture
def handler(db_url, conn, inbox_table):
    """The page's block, pointed at the test database, as a module's namespace (``handle``, ``outbox``)."""
    schema.create_table(db_url, "billing_outbox")
    conn.execute("CREATE TABLE invoices (order_id int PRIMARY KEY, amount int NOT NULL)")
    (block,) = re.findall(r"^<!-- run: pattern -->\n```python\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    assert PLACEHOLDER in block
    namespace: dict = {}
    exec(compile(block.replace(PLACEHOLDER, sqlalchemy_url(db_url)), str(PAGE), "exec"), namespace)
    yield namespace
    namespace["engine"].dispose()


def _state(conn) -> dict[str, list]:
    return {
        "inbox": [r["message_id"] for r in conn.execute("SELECT message_id FROM billing_inbox ORDER BY 1")],
        "invoices": [r["order_id"] for r in conn.execute("SELECT order_id FROM invoices ORDER BY 1")],
        "events": [r["event_id"] for r in conn.execute("SELECT event_id FROM billing_outbox ORDER BY id")],
    }


def test_a_repeat_changes_nothing(conn, handler):
    assert handler["handle"]("m-1", {"order_id": 1, "amount": 30}) is True
    once = _state(conn)
    assert once == {"inbox": ["m-1"], "invoices": [1], "events": ["invoice-m-1"]}
    assert handler["handle"]("m-1", {"order_id": 1, "amount": 30}) is False
    assert _state(conn) == once


def test_a_failure_after_the_enqueue_leaves_nothing_and_the_next_delivery_does_it_all(conn, handler):
    real = handler["outbox"]

    class CrashesAfterPublishing:
        def enqueue(self, *args, **kwargs):
            real.enqueue(*args, **kwargs)
            raise RuntimeError("the consumer died before its commit")

    handler["outbox"] = CrashesAfterPublishing()
    with pytest.raises(RuntimeError):
        handler["handle"]("m-2", {"order_id": 2, "amount": 40})
    assert _state(conn) == {"inbox": [], "invoices": [], "events": []}
    handler["outbox"] = real
    assert handler["handle"]("m-2", {"order_id": 2, "amount": 40}) is True
    assert _state(conn) == {"inbox": ["m-2"], "invoices": [2], "events": ["invoice-m-2"]}
