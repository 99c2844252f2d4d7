"""Why a destination could not be reached, read from what a client raised: one answer for every client.

Clients wrap the operating system's error in their own; the cause stays in the chain. ``network_code`` walks it
and names the cause (``models.NETWORK_FAILURES``): refused, unresolved name, TLS, timeout, reset or closed.
Every transport's classification (http/failures.py, nats/outcomes.py, rabbitmq/outcomes.py) asks it; Kafka's
reads librdkafka's codes.
"""

import socket
import ssl
from collections.abc import Iterator

from outbox_pipelines.core import models as m

# The most telling cause first: a TLS failure may end in a reset, a refused connection in a timeout.
_CAUSES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((ssl.SSLError, ssl.CertificateError), m.TLS_ERROR),
    ((socket.gaierror,), m.DNS_ERROR),
    ((ConnectionRefusedError,), m.CONNECTION_REFUSED),
    ((TimeoutError,), m.NETWORK_TIMEOUT),
    ((ConnectionResetError, ConnectionAbortedError, BrokenPipeError, EOFError), m.CONNECTION_LOST),
)

# What each code says of a destination, in an outcome's text.
WORDS: dict[str, str] = {
    m.TLS_ERROR: "the TLS handshake failed",
    m.DNS_ERROR: "the host name does not resolve",
    m.CONNECTION_REFUSED: "refused, nothing listens at that host and port",
    m.NETWORK_TIMEOUT: "no answer in time",
    m.CONNECTION_LOST: "the connection was reset or closed",
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps: causes, contexts, members of groups, aiohttp's ``os_error``."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        wrapped = getattr(current, "os_error", None)
        stack += [current.__cause__, current.__context__, wrapped if isinstance(wrapped, BaseException) else None]


def network_code(exc: BaseException) -> str | None:
    """The code of the network failure behind ``exc`` (TLS_ERROR, DNS_ERROR, CONNECTION_REFUSED, NETWORK_TIMEOUT,
    CONNECTION_LOST), or None when no network cause is in its chain."""
    found = list(_chain(exc))
    for kinds, code in _CAUSES:
        if any(isinstance(e, kinds) for e in found):
            return code
    return None
