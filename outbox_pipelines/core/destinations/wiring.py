"""Build the destination a table's settings name.

The engine's own destinations are built here; a wing's (core/wings.py: a kind and the
"module:factory" building it) through its factory, imported by name when a table uses it:
the engine never imports a wing.
"""

from outbox_pipelines.core import wings
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
from outbox_pipelines.core.destinations.paper import PaperBroker
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import Settings, TableSettings, import_attribute
from outbox_pipelines.core.settings.handler_specs import spec_target_problem


def load_registry(spec: str) -> HandlerRegistry:
    """Import 'package.module:attribute': a HandlerRegistry, or a function marked ``@HandlerRegistry.factory``
    (called once, here, and what it returns checked). Anything else is refused as it is named, never called."""
    target = import_attribute(spec, "handlers", shape="package.module:registry")
    if target is None:
        raise ConfigError(f"handlers = {spec!r}: the module has no such attribute; name its HandlerRegistry")
    problem = spec_target_problem(target)
    if problem is not None:
        raise ConfigError(f"handlers = {spec!r}: {problem}")
    if isinstance(target, HandlerRegistry):
        return target
    try:
        registry = target()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a factory that exits is its table's problem
        raise ConfigError(f"handlers = {spec!r}: the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(registry, HandlerRegistry):
        raise ConfigError(
            f"handlers = {spec!r}: the factory returned a {type(registry).__name__}, which is not a HandlerRegistry"
        )
    return registry


def build_wing_destination(table: TableSettings, settings: Settings) -> Destination:
    """A wing's destination, from the factory its wing names for the kind (core/wings.py)."""
    spec = wings.destinations()[table.destination]
    factory = import_attribute(spec, f"the factory of destination {table.destination!r}")
    if not callable(factory):
        raise ConfigError(f"destination {table.destination!r}: {spec} is not a destination factory")
    destination = factory(table, settings)
    if not isinstance(destination, Destination):
        raise ConfigError(
            f"destination {table.destination!r}: {spec} returned a {type(destination).__name__}, not a Destination"
        )
    return destination


# Each broker's destination module, imported only when a table uses it (its client library is an extra).
BROKER_MODULES = {
    "nats": "outbox_pipelines.core.destinations.nats.jetstream",
    "rabbitmq": "outbox_pipelines.core.destinations.rabbitmq.destination",
    "kafka": "outbox_pipelines.core.destinations.kafka.destination",
}


def build_broker_destination(table: TableSettings) -> Destination:
    """A broker table's destination: its module's ``build(table)``."""
    import importlib

    assert table.broker is not None
    module = importlib.import_module(BROKER_MODULES[table.broker.kind])
    destination: Destination = module.build(table)
    return destination


def build_destination(table: TableSettings, settings: Settings) -> Destination:
    if table.secrets_missing:  # read for status or replay only: its credential is not in this process
        raise ConfigError(table.secrets_missing)
    if table.destination == "http":
        # httpx only for an HTTP table: a relay of in-process handlers starts without it.
        from outbox_pipelines.core.destinations.http.destination import HttpDestination

        assert table.url  # settings refuse an http table without one
        # The table's own credential (settings: token_env, or OUTBOX_BROKER_TOKEN at the broker's origin), never
        # another's; its name (logs, run logs, alerts) is the URL's origin.
        return HttpDestination(
            table.url,
            timeout_s=table.timeout_s,
            max_in_flight=table.requests_in_flight,
            token=table.token,
            transport=table.transport,
            already_processed=table.already_processed,
            signing_secret=table.signing_secret,
        )
    if table.broker is not None:
        return build_broker_destination(table)
    if table.destination in wings.destinations():
        return build_wing_destination(table, settings)
    if table.destination == "handlers":
        assert table.handlers
        return HandlerDestination(
            load_registry(table.handlers), name=table.handlers, threads=table.handler_threads, timeout_s=table.timeout_s
        )
    if table.destination == "paper":
        return PaperBroker()
    raise ConfigError(
        f"[tables.{table.name}] destination = {table.destination!r} is not a destination this version knows"
    )
