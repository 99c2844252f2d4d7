"""What an HTTP attempt that got no answer means: the outcome of each exception an HTTP client raises,
alike on every transport, and the request checks that refuse what a client would refuse to send.

``ROWS`` is the table of those failures (``exception_outcome``); an answer's outcome is http/outcomes.py's table;
docs/reference/outcomes.md shows both, rendered by ``outcome_tables``.
"""

import re

import aiohttp
import httpx

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.network_failures import WORDS, network_code
from outbox_pipelines.core.destinations.outcome_rows import OutcomeRow
from outbox_pipelines.core.models import Outcome, OutcomeKind
from outbox_pipelines.core.redaction import mask_url, redact_text

# Control characters (CR, LF, NUL ...; TAB is allowed in header values) that no HTTP client sends in a header
# or a request target. Refused here, the same way on every transport, before anything goes on the wire.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

# Exceptions by which an HTTP client refuses to send a request: nothing reached the destination, and
# sending the same request again fails the same way (checked after the network errors, which come first).
CLIENT_REFUSALS: tuple[type[BaseException], ...] = (
    httpx.LocalProtocolError,  # h11: "Illegal header value b'a\\r\\nb'"
    httpx.InvalidURL,
    httpx.UnsupportedProtocol,
    aiohttp.InvalidURL,
    # aiohttp: "Forbidden control character detected in headers"; UnicodeEncodeError (httpx: non-ASCII header)
    ValueError,
    TypeError,
)

# The table, in the docs' order (after the answers'). Each branch of exception_outcome answers with one of these.
NO_ANSWER_IN_TIME = OutcomeRow(
    "no answer within the table's `timeout`", OutcomeKind.RETRY, m.NETWORK_TIMEOUT, " (circuit)"
)
CONNECTION_REFUSED = OutcomeRow(
    "connection refused: nothing listens at the URL's host and port",
    OutcomeKind.RETRY,
    m.CONNECTION_REFUSED,
    " (circuit)",
)
NAME_NOT_RESOLVED = OutcomeRow(
    "the URL's host name does not resolve (DNS)", OutcomeKind.RETRY, m.DNS_ERROR, " (circuit)"
)
TLS_FAILED = OutcomeRow(
    "the TLS handshake failed: a certificate that cannot be verified (self-signed, expired, another host's), "
    "a server that does not speak TLS",
    OutcomeKind.RETRY,
    m.TLS_ERROR,
    " (circuit)",
)
CONNECTION_FAILED = OutcomeRow(
    "connection reset or closed (connecting, sending or reading)", OutcomeKind.RETRY, m.CONNECTION_LOST, " (circuit)"
)
# A connection error's row, by its cause (network_failures.network_code).
_BY_CAUSE: dict[str, OutcomeRow] = {
    m.CONNECTION_REFUSED: CONNECTION_REFUSED,
    m.DNS_ERROR: NAME_NOT_RESOLVED,
    m.TLS_ERROR: TLS_FAILED,
}
CLIENT_REFUSED = OutcomeRow(
    "a request that cannot be built, or that the HTTP client refuses to send (a control "
    "character in a header, an invalid URL)",
    OutcomeKind.DEAD,
    m.BAD_REQUEST,
    " at once, nothing sent",
)
UNUSABLE_ANSWER = OutcomeRow(
    "garbage: an answer that is not HTTP (a bad status line), or a server that closed the "
    "connection before answering or mid-answer",
    OutcomeKind.RETRY,
    m.UNKNOWN,
    " (circuit), bounded by max attempts",
)
OTHER_ERROR = OutcomeRow(
    "any other error of the HTTP client", OutcomeKind.RETRY, m.UNKNOWN, " (circuit), bounded by max attempts"
)
ROWS = (
    NO_ANSWER_IN_TIME,
    CONNECTION_REFUSED,
    NAME_NOT_RESOLVED,
    TLS_FAILED,
    CONNECTION_FAILED,
    CLIENT_REFUSED,
    UNUSABLE_ANSWER,
    OTHER_ERROR,
)


def check_request(url: str, headers: dict[str, str]) -> None:
    """ValueError naming what the HTTP client would refuse to send."""
    for name, value in headers.items():
        if _CONTROL.search(name) or "\t" in name or not name:
            raise ValueError(f"header name {name[:64]!r} holds a control character (CR, LF, NUL ...) or is empty")
        if _CONTROL.search(value):
            raise ValueError(f"header {name!r} holds a control character (CR, LF, NUL ...): {value[:64]!r}")
    if _CONTROL.search(url):
        raise ValueError(f"the request URL holds a control character (CR, LF, NUL ...): {mask_url(url)[:200]!r}")


def _unwrap(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups (anyio raises those)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _as_httpx_error(exc: BaseException) -> BaseException:
    """The httpx error an aiohttp failure stands for, so every transport reports the same outcome.

    httpx-aiohttp maps every aiohttp connection error to ConnectTimeout (a refused
    connection, a server that hung up) and lets a bad status line through unmapped;
    classify by aiohttp's own exception instead, as httpx's native pools do.
    """
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__
    if not isinstance(cause, aiohttp.ClientError):
        return exc
    text = f"{type(cause).__name__}: {cause}"
    if isinstance(cause, aiohttp.ServerTimeoutError):
        return exc if isinstance(exc, httpx.TimeoutException) else httpx.ReadTimeout(text)
    if isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        return httpx.RemoteProtocolError(text)  # httpx: "Server disconnected…", "peer closed…", "illegal status line"
    if isinstance(cause, aiohttp.ClientConnectionError):
        return httpx.ConnectError(text)
    return exc


def exception_outcome(exc: BaseException, timeout_s: float) -> tuple[Outcome, str]:
    """The outcome of an attempt that got no answer, and the Attempt.failure it stands for: the one
    classification of every transport's errors (the cause read before aiohttp's are mapped onto httpx's)."""
    cause = network_code(exc)
    exc = _as_httpx_error(_unwrap(exc))
    text = redact_text(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.TimeoutException) and cause not in _BY_CAUSE:
        return NO_ANSWER_IN_TIME.outcome(f"no answer within {timeout_s:g} s ({type(exc).__name__})"), "timeout"
    if isinstance(
        exc, (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.CloseError, httpx.TimeoutException)
    ):
        row = _BY_CAUSE.get(cause or "", CONNECTION_FAILED)
        return row.outcome(
            f"connection failed: {WORDS.get(row.code or '', WORDS[m.CONNECTION_LOST])}: {text}"
        ), "connection"
    if isinstance(exc, CLIENT_REFUSALS):
        return CLIENT_REFUSED.outcome(f"the HTTP client refused to send the request: {text}"), "refused"
    if isinstance(exc, httpx.HTTPError):
        return UNUSABLE_ANSWER.outcome(f"unusable answer: {text}"), "protocol"
    return OTHER_ERROR.outcome(text), "error"
