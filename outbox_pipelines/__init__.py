"""outbox_pipelines: a transactional outbox for PostgreSQL, run by Dagster.

    from outbox_pipelines import Message, Outbox
    outbox = Outbox("outbox_events")
    with engine.begin() as conn:          # the business transaction
        conn.execute(...)                 # business write
        outbox.enqueue(conn, Message(topic="org.changed", payload={...}, event_id=...))
"""

from outbox_pipelines.core.destinations import HandlerDestination, HandlerRegistry, HttpDestination, PaperBroker
from outbox_pipelines.core.errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidTableName,
    OutboxError,
    PermanentError,
    UnknownTable,
)
from outbox_pipelines.core.models import ClaimedMessage, EnqueueResult, Message, Outcome
from outbox_pipelines.core.relay import Relay, RelayReport
from outbox_pipelines.core.retry import PRESETS, RetryPolicy
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings
from outbox_pipelines.core.store import Outbox

__all__ = [
    "PRESETS",
    "ClaimedMessage",
    "ConfigError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "HandlerDestination",
    "HandlerRegistry",
    "HttpDestination",
    "InvalidMessage",
    "InvalidTableName",
    "Message",
    "Outbox",
    "OutboxError",
    "Outcome",
    "PaperBroker",
    "PermanentError",
    "Relay",
    "RelayReport",
    "RetryPolicy",
    "Settings",
    "TableSettings",
    "UnknownTable",
    "load_settings",
]
