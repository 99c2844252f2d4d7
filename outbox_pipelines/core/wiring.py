"""Build the destination a table's settings name."""

import importlib

from outbox_pipelines.core.destinations import HandlerDestination, HandlerRegistry, HttpDestination, PaperBroker
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import Settings, TableSettings


def load_registry(spec: str) -> HandlerRegistry:
    """Import 'package.module:attribute' and check it is a HandlerRegistry."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"handlers = {spec!r}: write it as 'package.module:registry'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handlers = {spec!r}: cannot import {module_name}: {exc}") from None
    registry = getattr(module, attribute, None)
    if callable(registry) and not isinstance(registry, HandlerRegistry):
        registry = registry()
    if not isinstance(registry, HandlerRegistry):
        raise ConfigError(f"handlers = {spec!r} is not a HandlerRegistry (got {type(registry).__name__})")
    return registry


def build_destination(table: TableSettings, settings: Settings) -> Destination:
    if table.destination == "http":
        assert table.url
        # The destination's own credential (OUTBOX_BROKER_TOKEN), never the Order API's tokens; its name
        # (logs, run logs, alerts) is the URL without user-info.
        return HttpDestination(
            table.url,
            timeout_s=table.timeout_s,
            parallelism=table.concurrency,
            token=settings.env.broker_token,
            transport=table.transport,
        )
    if table.destination == "orders":
        from outbox_pipelines.core.destinations.orders import OrderBroker

        return OrderBroker(table.url, token=settings.env.broker_token, concurrency=table.concurrency,
                           transport=table.transport)
    if table.destination == "handlers":
        assert table.handlers
        return HandlerDestination(load_registry(table.handlers), name=table.handlers, parallelism=table.parallelism)
    return PaperBroker()
