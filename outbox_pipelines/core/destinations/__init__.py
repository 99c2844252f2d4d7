"""Where messages go: an HTTP endpoint, in-process handlers, or the paper broker."""

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
from outbox_pipelines.core.destinations.http import HttpDestination, HttpRequest
from outbox_pipelines.core.destinations.paper import PaperBroker

__all__ = ["Destination", "HandlerDestination", "HandlerRegistry", "HttpDestination", "HttpRequest", "PaperBroker"]
