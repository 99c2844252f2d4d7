"""The context every destination passes on with a message: its creation context as W3C ``traceparent`` and
``tracestate`` (forwarded as stored), the message's trace id and its tenant.

A module of its own so that a broker destination need not import the HTTP one (aiohttp and httpx: 0.4 s).
"""

import re

from outbox_pipelines.core.models import ClaimedMessage

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
# W3C Trace Context, "tracestate": at most 32 "key=value" members, 512 characters in all.
TRACESTATE_MAX_CHARS = 512
TRACESTATE_MAX_MEMBERS = 32
_MEMBER = re.compile(
    r"(?:[a-z0-9][a-z0-9_\-*/]{0,240}\x40[a-z][a-z0-9_\-*/]{0,13}|[a-z][a-z0-9_\-*/]{0,255})"  # \x40: tenant@system
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


def valid_traceparent(value: object) -> str | None:
    """``value`` when it is a well-formed traceparent, else None (nothing malformed is passed on)."""
    return value if isinstance(value, str) and TRACEPARENT.match(value) else None


def valid_tracestate(value: object) -> str | None:
    """``value`` (its empty members dropped) when it is a well-formed tracestate of at most 512 characters,
    else None: a bad one is dropped, never passed on."""
    if not isinstance(value, str) or not value or len(value) > TRACESTATE_MAX_CHARS:
        return None
    members = [member.strip(" \t") for member in value.split(",")]
    members = [member for member in members if member]
    if not members or len(members) > TRACESTATE_MAX_MEMBERS or not all(map(_MEMBER.fullmatch, members)):
        return None
    return ",".join(members)


def trace_headers(message: ClaimedMessage) -> dict[str, str]:
    """``{"traceparent": ..., "tracestate": ...}`` for a message whose headers carry a well-formed
    traceparent (``tracestate`` only beside one, and only when well-formed), else ``{}``."""
    headers = message.headers
    value = valid_traceparent(headers.get("traceparent")) if isinstance(headers, dict) else None
    if not value:
        return {}
    state = valid_tracestate(headers.get("tracestate"))
    return {"traceparent": value, "tracestate": state} if state else {"traceparent": value}


def context_headers(message: ClaimedMessage) -> dict[str, str]:
    """The headers the HTTP, NATS and RabbitMQ destinations send after their own: ``traceparent``,
    ``tracestate``, ``X-Trace-Id`` and ``X-Tenant-Id``, each when the message has it (Kafka names its
    headers its own way)."""
    headers: dict[str, str] = {}
    if message.headers:  # most messages carry no trace context: no look-ups for them
        headers = trace_headers(message)
        trace_id = message.trace_id
        if trace_id:
            headers["X-Trace-Id"] = trace_id
    if message.tenant_id:
        headers["X-Tenant-Id"] = message.tenant_id
    return headers
