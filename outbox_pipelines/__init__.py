"""outbox_pipelines: a transactional outbox for PostgreSQL, run by Dagster.

from outbox_pipelines import Message, Outbox
outbox = Outbox("billing_outbox")     # a table the project declares (outbox.toml)
with engine.begin() as conn:          # the business transaction
    conn.execute(...)                 # business write
    outbox.enqueue(conn, Message(topic="org.changed", payload={...}, event_id=...))
"""

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from outbox_pipelines.core.canonical import set_payload_encoder
from outbox_pipelines.core.errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidTableName,
    NoTransaction,
    OutboxError,
    PermanentError,
    UnknownTable,
)
from outbox_pipelines.core.models import ClaimedMessage, EnqueueResult, Message, Outcome
from outbox_pipelines.core.retry import RetryPolicy

if TYPE_CHECKING:
    from outbox_pipelines.core.destinations import Destination, HandlerRegistry
    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.inbox.receive import Inbox
    from outbox_pipelines.core.inbox.webhook_verification import (
        WebhookHeaderMissing,
        WebhookSecretInvalid,
        WebhookSignatureMalformed,
        WebhookSignatureMismatch,
        WebhookTimestampMalformed,
        WebhookTimestampTooNew,
        WebhookTimestampTooOld,
        WebhookVerificationError,
        WebhookVerifier,
        verify_webhook,
    )
    from outbox_pipelines.defs.component import OutboxComponent
    from outbox_pipelines.defs.factory import outbox_definitions

# Loaded on first use: the destinations import aiohttp and httpx (~0.3 s measured with -X importtime), the
# Dagster side imports dagster; an application that only enqueues needs neither. The enqueue's modules (~15 ms
# more than a relay imports) wait for the first ``Outbox``: a relay or a command of the CLI never writes one.
_ON_FIRST_USE = {
    "Outbox": "outbox_pipelines.core.enqueue",
    "Destination": "outbox_pipelines.core.destinations",
    "HandlerRegistry": "outbox_pipelines.core.destinations",
    # The receiving side: a consumer's record of the messages it handled (docs/how-to/inbox.md).
    "Inbox": "outbox_pipelines.core.inbox.receive",
    # For a project's defs.yaml (`type: outbox_pipelines.OutboxComponent`) and a Definitions written by hand.
    "OutboxComponent": "outbox_pipelines.defs.component",
    "outbox_definitions": "outbox_pipelines.defs.factory",
    # A receiver's check of our signed webhooks (standard library only): loaded when a receiver asks.
    "verify_webhook": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookVerifier": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookVerificationError": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookHeaderMissing": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookTimestampMalformed": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookTimestampTooOld": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookTimestampTooNew": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookSignatureMalformed": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookSignatureMismatch": "outbox_pipelines.core.inbox.webhook_verification",
    "WebhookSecretInvalid": "outbox_pipelines.core.inbox.webhook_verification",
}

# Names this package once exported that are the engine's, not the public API: still found here, with a
# DeprecationWarning saying where they live (removed in 0.3.0; CONTRIBUTING.md, "Versions and deprecations").
_MOVED = {
    "HandlerDestination": "outbox_pipelines.core.destinations",
    "HttpDestination": "outbox_pipelines.core.destinations",
    "PaperBroker": "outbox_pipelines.core.destinations",
    "Relay": "outbox_pipelines.core.relay",
    "RelayReport": "outbox_pipelines.core.relay",
    "Settings": "outbox_pipelines.core.settings",
    "TableSettings": "outbox_pipelines.core.settings",
    "load_settings": "outbox_pipelines.core.settings",
}
_MOVED_PRESETS = "PRESETS"
_REMOVED_IN = "0.3.0"


def database_url() -> str:
    """The database the CLI, the relays and Dagster use, for the application's own connections: OUTBOX_DATABASE_URL,
    else the project's embedded PostgreSQL where one was asked for (``.outbox/`` made by ``outbox-pipelines dev``,
    or OUTBOX_EMBEDDED_DIR; started if it is not running); else ConfigError naming OUTBOX_DATABASE_URL.
    The URL may hold a password: connect with it, never print it."""
    from outbox_pipelines.core.storage import db

    return db.resolve_database(announce=False).url


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Serve this process's outbox metrics (``outbox_enqueue_total{table,topic}`` of what it enqueued) on
    ``http://host:port/metrics``, from a background thread (prometheus_client's server)."""
    from outbox_pipelines.core.telemetry import metrics

    metrics.serve(port, host)


def expose_metrics(registry: Any = None) -> None:
    """Add this process's outbox metrics to ``registry`` (default: prometheus_client's default registry), for an
    application whose own /metrics endpoint (``make_asgi_app()``, ``make_wsgi_app()``, ``start_http_server``)
    already serves that registry."""
    from prometheus_client import REGISTRY as DEFAULT

    from outbox_pipelines.core.telemetry import metrics

    metrics.expose_in(DEFAULT if registry is None else registry)


def __dir__() -> list[str]:
    # dg lists a registry module's components by dir(): the names loaded on first use are there too.
    return sorted({*globals(), *_ON_FIRST_USE, "__version__"})


def _version() -> str:
    """pyproject.toml's version, as installed (a wheel, or pip install -e .). Read on first use: importlib.metadata
    costs an application's start-up 60 ms it may never need."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("outbox_pipelines")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = found = _version()
        return found
    module = _ON_FIRST_USE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _MOVED or name == _MOVED_PRESETS:
        where = f"{_MOVED[name]}.{name}" if name in _MOVED else "outbox_pipelines.core.retry.all_presets()"
        warnings.warn(
            f"outbox_pipelines.{name} is not part of the public API and goes in {_REMOVED_IN}: use {where}",
            DeprecationWarning,
            stacklevel=2,
        )
        if name == _MOVED_PRESETS:
            from outbox_pipelines.core.retry import all_presets

            return all_presets()
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The public API: what docs/reference/api.md lists, name by name (test_public_api.py keeps the two equal).
__all__ = [
    "__version__",
    # Writing messages
    "Outbox",
    "Message",
    "EnqueueResult",
    "set_payload_encoder",
    "database_url",
    # Receiving messages
    "Inbox",
    # Errors
    "OutboxError",
    "InvalidMessage",
    "InvalidTableName",
    "NoTransaction",
    "UnknownTable",
    "ConfigError",
    "DatabaseUnavailable",
    "PermanentError",
    # Handlers and destinations of your own
    "HandlerRegistry",
    "ClaimedMessage",
    "Destination",
    "Outcome",
    "RetryPolicy",
    # Dagster
    "OutboxComponent",
    "outbox_definitions",
    # Metrics
    "serve_metrics",
    "expose_metrics",
    # Receiving signed webhooks
    "verify_webhook",
    "WebhookVerifier",
    "WebhookVerificationError",
    "WebhookHeaderMissing",
    "WebhookTimestampMalformed",
    "WebhookTimestampTooOld",
    "WebhookTimestampTooNew",
    "WebhookSignatureMalformed",
    "WebhookSignatureMismatch",
    "WebhookSecretInvalid",
]
