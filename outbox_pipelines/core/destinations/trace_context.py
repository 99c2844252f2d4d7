"""The context every destination passes on with a message: the relay's send span as a W3C traceparent,
the message's trace id and its tenant.

A module of its own so that a broker destination need not import the HTTP one (aiohttp and httpx: 0.4 s).
"""

import re

from outbox_pipelines.core.models import ClaimedMessage

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def valid_traceparent(value: object) -> str | None:
    """``value`` when it is a well-formed traceparent, else None (nothing malformed is passed on)."""
    return value if isinstance(value, str) and TRACEPARENT.match(value) else None


def trace_headers(message: ClaimedMessage) -> dict[str, str]:
    """``{"traceparent": ...}`` for a message whose headers carry a well-formed one, else ``{}``."""
    value = valid_traceparent(message.headers.get("traceparent")) if isinstance(message.headers, dict) else None
    return {"traceparent": value} if value else {}


def context_headers(message: ClaimedMessage) -> dict[str, str]:
    """The headers the HTTP, NATS and RabbitMQ destinations send after their own: ``traceparent``,
    ``X-Trace-Id`` and ``X-Tenant-Id``, each when the message has it (Kafka names its headers its own way)."""
    headers: dict[str, str] = {}
    if message.headers:  # most messages carry no trace context: no look-ups for them
        headers = trace_headers(message)
        trace_id = message.trace_id
        if trace_id:
            headers["X-Trace-Id"] = trace_id
    if message.tenant_id:
        headers["X-Tenant-Id"] = message.tenant_id
    return headers
