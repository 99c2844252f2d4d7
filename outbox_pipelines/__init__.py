"""outbox_pipelines: a transactional outbox for PostgreSQL, run by Dagster.

from outbox_pipelines import Message, Outbox
outbox = Outbox("outbox_events")
with engine.begin() as conn:          # the business transaction
    conn.execute(...)                 # business write
    outbox.enqueue(conn, Message(topic="org.changed", payload={...}, event_id=...))
"""

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version
from typing import TYPE_CHECKING, Any

from outbox_pipelines.core import wings
from outbox_pipelines.core.canonical import set_payload_encoder
from outbox_pipelines.core.enqueue import Outbox
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
from outbox_pipelines.core.retry import RetryPolicy, all_presets
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings

try:
    # pyproject.toml's version, as installed (a wheel, or pip install -e .).
    __version__ = _installed_version("outbox_pipelines")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

# The wings on the engine (core/wings.py): the order product and the examples. Declared here, outside the
# engine, so the engine never names them; each is loaded the first time the engine asks what wings bring.
wings.declare("outbox_pipelines.orders.wing:WING", "outbox_pipelines.examples.wing:WING")
# Every retry preset by name, the wings' included (seed 000's "orders", seed 003's "memory", seed 004's "generic").
PRESETS = all_presets()

if TYPE_CHECKING:
    from outbox_pipelines.core.destinations import (
        Destination,
        HandlerDestination,
        HandlerRegistry,
        HttpDestination,
        PaperBroker,
    )
    from outbox_pipelines.core.relay import Relay, RelayReport
    from outbox_pipelines.defs.component import OutboxComponent
    from outbox_pipelines.defs.factory import outbox_definitions

# The relay side loads on first use: its HTTP destination imports aiohttp and httpx
# (~0.3 s measured with -X importtime), which an application that only enqueues never needs.
_RELAY_SIDE = {
    "Destination": "outbox_pipelines.core.destinations",
    "HandlerDestination": "outbox_pipelines.core.destinations",
    "HandlerRegistry": "outbox_pipelines.core.destinations",
    "HttpDestination": "outbox_pipelines.core.destinations",
    "PaperBroker": "outbox_pipelines.core.destinations",
    "Relay": "outbox_pipelines.core.relay",
    "RelayReport": "outbox_pipelines.core.relay",
    # The Dagster side, for a project's defs.yaml (`type: outbox_pipelines.OutboxComponent`) and a Definitions
    # written by hand: loaded on first use, so an application that enqueues never imports dagster.
    "OutboxComponent": "outbox_pipelines.defs.component",
    "outbox_definitions": "outbox_pipelines.defs.factory",
}


def database_url() -> str:
    """The database the CLI, the relays and Dagster use, for the application's own connections: OUTBOX_DATABASE_URL,
    else the project's embedded PostgreSQL (found from the working directory, started if it is not running).
    The URL may hold a password: connect with it, never print it."""
    from outbox_pipelines.core.storage import db

    return db.resolve_database(announce=False).url


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Serve this process's outbox metrics (``outbox_enqueue_total{table,topic}`` of what it enqueued) on
    ``http://host:port/metrics``, from a background thread (prometheus_client's server)."""
    from outbox_pipelines.core.oncall import metrics

    metrics.serve(port, host)


def expose_metrics(registry: Any = None) -> None:
    """Add this process's outbox metrics to ``registry`` (default: prometheus_client's default registry), for an
    application whose own /metrics endpoint (``make_asgi_app()``, ``make_wsgi_app()``, ``start_http_server``)
    already serves that registry."""
    from prometheus_client import REGISTRY as DEFAULT

    from outbox_pipelines.core.oncall import metrics

    metrics.expose_in(DEFAULT if registry is None else registry)


def __dir__() -> list[str]:
    # dg lists a registry module's components by dir(): the names loaded on first use are there too.
    return sorted({*globals(), *_RELAY_SIDE})


def __getattr__(name: str) -> Any:
    module = _RELAY_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "PRESETS",
    "__version__",
    "ClaimedMessage",
    "ConfigError",
    "DatabaseUnavailable",
    "Destination",
    "EnqueueResult",
    "HandlerDestination",
    "HandlerRegistry",
    "HttpDestination",
    "InvalidMessage",
    "InvalidTableName",
    "OutboxComponent",
    "Message",
    "NoTransaction",
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
    "database_url",
    "set_payload_encoder",
    "expose_metrics",
    "load_settings",
    "outbox_definitions",
    "serve_metrics",
]
