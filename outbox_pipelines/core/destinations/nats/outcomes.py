"""What each answer of a NATS server, and each failure of the client, means for a message: the NATS
destination's outcome table (``ROWS``; docs/destinations.md shows it, rendered by ``outcome_tables``).

Texts have the connection's credentials scrubbed. Why some rows are as they are:
docs/explanation/transports.md, "NATS: what each answer means".
"""

import asyncio
import re
from dataclasses import replace
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.nats.wire import MAX_SUBJECT_BYTES
from outbox_pipelines.core.destinations.network_failures import WORDS, network_code
from outbox_pipelines.core.destinations.outcome_rows import OutcomeRow
from outbox_pipelines.core.models import Outcome, OutcomeKind
from outbox_pipelines.core.redaction import Scrubber

# JetStream error codes that are the message's own problem (the same message is refused again):
# 10054 "message size exceeds maximum allowed" (the stream's max_msg_size).
MESSAGE_ERROR_CODES = frozenset({10054})
# nats-py reports a refused publish or subscription through its error callback only (the server keeps the
# connection open and sends no ack): 'nats: permissions violation for publish to "orders.created"'.
_PERMISSION = re.compile(r"permissions violation for (publish|subscription) to \"(.*)\"", re.IGNORECASE)

# The table, in the docs' order. Every outcome here (and NO_RESPONDERS) is one of these rows'.
PUBACK = OutcomeRow(
    "PubAck (also with `duplicate: true`: the stream already holds it, once)",
    OutcomeKind.SENT,
    then=", ref `stream:seq`",
)
NO_STREAM = OutcomeRow(
    "no responders, and JetStream confirms no stream takes the subject",
    OutcomeKind.DEAD,
    m.NO_SUBSCRIBERS,
    " (replay once a stream takes it)",
)
NOT_ANSWERING = OutcomeRow(
    "no responders while a stream does take the subject, or JetStream's API silent (a server shutting down)",
    OutcomeKind.RETRY,
    m.BROKER_5XX,
    " (circuit)",
)
MESSAGE_REFUSED = OutcomeRow(
    "payload and headers over the server's `max_payload`; a subject that is empty, has an empty token, whitespace, "
    f"`*`, `>`, a `$` prefix or is over {MAX_SUBJECT_BYTES:,} bytes (refused before sending); a stream's "
    "`max_msg_size` exceeded",
    OutcomeKind.DEAD,
    m.BAD_REQUEST,
)
DENIED = OutcomeRow(
    "authorization violation at connect, a denied publish or reply subscription",
    OutcomeKind.RETRY,
    m.UNAUTHORIZED,
    " (circuit)",
)
NO_ANSWER = OutcomeRow(
    "no connection or no PubAck within `timeout`", OutcomeKind.RETRY, m.NETWORK_TIMEOUT, " (circuit)"
)
REFUSED = OutcomeRow(
    "connection refused: nothing listens at the server's host and port",
    OutcomeKind.RETRY,
    m.CONNECTION_REFUSED,
    " (circuit)",
)
NAME_NOT_RESOLVED = OutcomeRow(
    "the server's host name does not resolve (DNS)", OutcomeKind.RETRY, m.DNS_ERROR, " (circuit)"
)
TLS_FAILED = OutcomeRow(
    "the TLS handshake failed (a certificate that cannot be verified)", OutcomeKind.RETRY, m.TLS_ERROR, " (circuit)"
)
CONNECTION_LOST = OutcomeRow("connection closed or lost", OutcomeKind.RETRY, m.CONNECTION_LOST, " (circuit)")
# A network failure's row, by its cause (network_failures.network_code).
_BY_CAUSE: dict[str, OutcomeRow] = {
    m.NETWORK_TIMEOUT: NO_ANSWER,
    m.CONNECTION_REFUSED: REFUSED,
    m.DNS_ERROR: NAME_NOT_RESOLVED,
    m.TLS_ERROR: TLS_FAILED,
}
JETSTREAM_ERROR = OutcomeRow(
    "any other JetStream error (stream full with `discard: new`, store failure, JetStream off)",
    OutcomeKind.RETRY,
    m.BROKER_5XX,
    " (circuit)",
)
NOT_JETSTREAMS = OutcomeRow(
    "a reply that is not JetStream's; any other error of the client", OutcomeKind.RETRY, m.UNKNOWN, " (circuit)"
)
ROWS = (
    PUBACK,
    NO_STREAM,
    NOT_ANSWERING,
    MESSAGE_REFUSED,
    DENIED,
    NO_ANSWER,
    REFUSED,
    NAME_NOT_RESOLVED,
    TLS_FAILED,
    CONNECTION_LOST,
    JETSTREAM_ERROR,
    NOT_JETSTREAMS,
)

# A reply's result when nothing listens on the subject (status 503): resolved against JetStream's API.
NO_RESPONDERS = NOT_ANSWERING.outcome("no responders")


def permission_violation(exc: Exception) -> tuple[str, str] | None:
    """("publish" or "subscription", the subject) when ``exc`` is the server refusing one, else None."""
    match = _PERMISSION.search(str(exc))
    if match is None:
        return None
    kind, subject = match.groups()
    return kind.lower(), subject


class NatsOutcomes:
    """The outcome table of one destination: each outcome names its server and is scrubbed of its credentials."""

    def __init__(self, name: str, scrub: Scrubber, timeout_s: float) -> None:
        self.name = name
        self.scrub = scrub
        self.timeout_s = timeout_s
        self.no_ack = NO_ANSWER.outcome(f"no PubAck from NATS {name} within {timeout_s:g} s")
        self.closed = CONNECTION_LOST.outcome(f"connection to NATS {name} closed before the PubAck")

    def denied(self, why: str) -> Outcome:
        """The server refuses these credentials something the delivery needs (``why`` says what)."""
        return DENIED.outcome(self.scrub(why))

    def reply(self, msg: Msg) -> Outcome:
        """The outcome a reply on the inbox says: the PubAck, JetStream's error, or no responders."""
        if not msg.data and msg.headers and msg.headers.get("Status") == "503":
            return NO_RESPONDERS
        try:
            answer = orjson.loads(msg.data)
            error = answer.get("error")
            if error is None:
                # A PubAck with "duplicate": true is sent too: the stream already holds this event_id (an
                # earlier attempt whose ack was lost) and stored nothing new; the ref names the copy it holds.
                return PUBACK.outcome(ref=f"{answer['stream']}:{answer['seq']}")
            return self.api_error(error)
        except (ValueError, TypeError, KeyError, AttributeError):
            return NOT_JETSTREAMS.outcome(
                self.scrub(
                    f"NATS {self.name} answered the publish with something that is not a PubAck: {msg.data[:200]!r}"
                )
            )

    def api_error(self, error: dict[str, Any]) -> Outcome:
        what = self.scrub(
            f"JetStream on NATS {self.name} refused the message: {error.get('description')} "
            f"(code {error.get('code')}, err_code {error.get('err_code')})"
        )
        if error.get("err_code") in MESSAGE_ERROR_CODES:
            return MESSAGE_REFUSED.outcome(what)
        # Stream full (discard: new), store failure, JetStream unavailable ...: the broker's state, not the
        # message's; retried, and a table where every message fails this way opens its circuit.
        return JETSTREAM_ERROR.outcome(what)

    def exception(self, exc: BaseException) -> Outcome:
        """The outcome of a publish the client refused or could not make."""
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, (nats.errors.BadSubjectError, nats.errors.MaxPayloadError, nats.errors.BadHeaderError)):
            outcome = MESSAGE_REFUSED.outcome(f"the NATS client refused to publish the message: {text}")
        elif isinstance(exc, nats.js.errors.APIError):
            outcome = self.api_error({"description": exc.description, "code": exc.code, "err_code": exc.err_code})
        elif isinstance(
            exc,
            (
                nats.errors.ConnectionClosedError,
                nats.errors.OutboundBufferLimitError,
                nats.errors.ConnectionDrainingError,
                nats.errors.ConnectionReconnectingError,
                nats.errors.StaleConnectionError,
                asyncio.TimeoutError,
                TimeoutError,
                OSError,
            ),
        ):
            row = _BY_CAUSE.get(network_code(exc) or "", CONNECTION_LOST)
            outcome = row.outcome(f"connection to NATS {self.name} lost: {text}")
        else:
            outcome = NOT_JETSTREAMS.outcome(f"NATS {self.name}: {text}")
        return replace(outcome, error=self.scrub(outcome.error))

    def connect_failed(self, exc: Exception, errors: list[Exception], where: str) -> Outcome:
        """The outcome of every message of a batch when connecting to the server at ``where`` failed."""
        # "no servers available" says less than the error that used the last try up (refused, reset ...).
        cause = errors[-1] if isinstance(exc, nats.errors.NoServersError) and errors else exc
        text = f"{type(cause).__name__}: {cause}".strip()
        if (
            isinstance(cause, nats.errors.AuthorizationError)
            or "authoriz" in text.lower()
            or "authentication" in text.lower()
        ):
            return DENIED.outcome(self.scrub(f"NATS {where} refused the credentials: {text}"))
        row = _BY_CAUSE.get(network_code(cause) or "", CONNECTION_LOST)
        if row is NO_ANSWER:
            text = f"no answer within {self.timeout_s:g} s"
        elif row is not CONNECTION_LOST:
            text = f"{WORDS[row.code or '']} ({text})"
        return row.outcome(self.scrub(f"cannot connect to NATS {where}: {text}"))

    async def no_responders(self, nc: Client, subject: str) -> Outcome:
        """No responders to a publish: no stream takes the subject (dead), or JetStream is not answering
        (a server shutting down answers so before it closes the connection): asked of JetStream's API."""
        try:
            stream = await nc.jsm(timeout=self.timeout_s).find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            return NO_STREAM.outcome(
                f"no JetStream stream on NATS {self.name} takes subject {subject!r}: add the "
                "subject to a stream, then replay the message"
            )
        except nats.js.errors.ServiceUnavailableError:
            return NOT_ANSWERING.outcome(
                f"JetStream on NATS {self.name} is not answering (no responders to a "
                "publish or to its API: shutting down, or not enabled for this account)"
            )
        except Exception as exc:  # the check itself failed (connection lost ...)
            return self.exception(exc)
        return NOT_ANSWERING.outcome(
            f"stream {stream!r} on NATS {self.name} takes subject {subject!r} but did not "
            "answer the publish (restarting, or no leader)"
        )
