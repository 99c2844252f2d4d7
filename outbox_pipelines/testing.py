"""Helpers for testing your own code that writes to an outbox, with pytest or unittest alike.

    from outbox_pipelines.testing import RecordingDestination, enqueued, relay_once

    def test_placing_an_order_announces_it(conn):          # your fixture: a connection to a test database
        place_order(conn, customer="acme")                 # your code: the business write and its enqueue
        [message] = enqueued(conn, "orders_outbox", topic="order.placed")
        assert message.payload["customer"] == "acme"

    def test_the_announcement_reaches_the_handler(db_url, conn):
        place_order(conn, customer="acme")
        conn.commit()
        recorder = RecordingDestination()
        report = relay_once(db_url, "orders_outbox", recorder)  # claim, deliver, settle: in this process
        assert report.sent == 1 and recorder.delivered[0].topic == "order.placed"

The database is yours (a test database migrated by ``outbox-pipelines db upgrade``); these helpers only read
what your code wrote and relay it once, through the same statements as production.
"""

from dataclasses import dataclass
from typing import Any

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.relay import Relay, RelayReport
from outbox_pipelines.core.settings import TableSettings, load_settings
from outbox_pipelines.core.storage.app_connections import sync_target
from outbox_pipelines.core.storage.connections import driver_connection
from outbox_pipelines.core.storage.queries import table_query
from outbox_pipelines.core.storage.statements import NOT_AN_OUTBOX, unknown_table

__all__ = ["RecordingDestination", "StoredMessage", "enqueued", "relay_once"]


@dataclass(frozen=True)
class StoredMessage:
    """A message as the outbox table holds it."""

    id: int
    event_id: str
    tenant_id: str | None
    topic: str
    payload: Any
    headers: dict[str, Any]
    ordering_key: str | None
    status: str
    attempts: int


def enqueued(conn: Any, table: str, *, topic: str | None = None) -> list[StoredMessage]:
    """The messages in ``table`` (of ``topic``, if given), oldest first. ``conn`` is any connection ``enqueue``
    takes (psycopg, SQLAlchemy, Django's): on the one your code wrote with, inside its transaction, it sees what
    that transaction wrote so far; on another, what was committed."""
    from psycopg.rows import tuple_row

    pg = driver_connection(sync_target(conn, outside_transaction=True))
    try:
        with pg.cursor(row_factory=tuple_row) as cur:
            cur.execute(table_query("outbox_messages_of_topic", validate_table_name(table)), {"topic": topic})
            return [StoredMessage(*row) for row in cur.fetchall()]
    except NOT_AN_OUTBOX as exc:
        raise unknown_table(table, exc) from None


class RecordingDestination(Destination):
    """Records every message delivered to it, in order, and answers each with ``outcome(message)`` (default:
    sent). ``delivered`` is what a relay handed over; a retried message appears once per attempt."""

    name = "recording"

    def __init__(self, outcome: Any = None) -> None:
        self.delivered: list[ClaimedMessage] = []
        self._outcome = outcome or (lambda message: Outcome.sent())

    def deliver(self, messages: Any) -> list[Outcome]:
        self.delivered.extend(messages)
        return [self._outcome(message) for message in messages]


def relay_once(
    database_url: str, table: str, destination: Destination, *, settings: TableSettings | None = None
) -> RelayReport:
    """Relay what is ready in ``table`` now to ``destination``, in this process (claim, deliver, settle, the audit
    trail), and return the report (``sent``, ``retried``, ``dead``, ...). ``settings``: the table's; default the
    project's declaration of it (outbox.toml or the component's defs.yaml), else the defaults."""
    if settings is None:
        declared = load_settings().tables.get(validate_table_name(table))
        settings = declared if declared is not None else TableSettings(name=table)
    return Relay(database_url, settings, destination, worker_id="outbox_pipelines.testing").run(once=True)
