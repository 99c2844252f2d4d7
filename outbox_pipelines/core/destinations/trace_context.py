"""The W3C trace context every destination passes on: the relay's send span, as a traceparent.

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
