"""Where messages go: an HTTP endpoint, in-process handlers, or the paper broker.

A wing's destinations (the order broker) live in the wing (orders), built by wiring.
"""

from typing import TYPE_CHECKING, Any

from outbox_pipelines.core.destinations.base import Destination

if TYPE_CHECKING:
    from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
    from outbox_pipelines.core.destinations.http.destination import HttpDestination, HttpRequest
    from outbox_pipelines.core.destinations.paper import PaperBroker

# Imported on first use: a relay of in-process handlers need not load httpx (a relay process starts faster).
_HOMES = {
    "HandlerDestination": "handlers",
    "HandlerRegistry": "handlers",
    "HttpDestination": "http.destination",
    "HttpRequest": "http.destination",
    "PaperBroker": "paper",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = ["Destination", "HandlerDestination", "HandlerRegistry", "HttpDestination", "HttpRequest", "PaperBroker"]
