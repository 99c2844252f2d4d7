"""The handler registry of the shipped ``outbox_events`` table.

Copy this module to register your own handlers, and point the table's
``handlers = "your.module:registry"`` setting at it.
"""

import logging

from outbox_pipelines.core.destinations.handlers import HandlerRegistry
from outbox_pipelines.core.errors import PermanentError
from outbox_pipelines.core.models import ClaimedMessage

log = logging.getLogger("outbox_pipelines.examples")

registry = HandlerRegistry()


@registry.on("org.changed")
def log_org_changed(message: ClaimedMessage) -> str:
    org = message.payload.get("org_id")
    if org is None:
        raise PermanentError("org.changed needs org_id", code="BAD_PAYLOAD")
    log.info("org %s changed (event %s)", org, message.event_id)
    return f"org:{org}"


@registry.on("demo.flaky")
def sometimes_fails(message: ClaimedMessage) -> None:
    """Fails on the first attempt, succeeds on the next: shows a retry in the demo."""
    if message.attempts < 2:
        raise RuntimeError("simulated transient failure")
