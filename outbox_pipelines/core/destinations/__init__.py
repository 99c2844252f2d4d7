"""Where messages go: an HTTP endpoint, in-process handlers, or the paper broker.

A wing's destinations (the order broker) live in the wing (core/orders), built by wiring.
"""

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
from outbox_pipelines.core.destinations.http import HttpDestination, HttpRequest
from outbox_pipelines.core.destinations.paper import PaperBroker

__all__ = ["Destination", "HandlerDestination", "HandlerRegistry", "HttpDestination", "HttpRequest", "PaperBroker"]
