"""What each answer of a RabbitMQ broker, and each failure of the AMQP client (aiormq), means for a
message: the RabbitMQ destination's outcome table (``ROWS``; docs/destinations.md shows it, rendered by
``outcome_tables``). Error texts have the URL's credentials scrubbed.

Why some rows are as they are: docs/explanation/transports.md, "RabbitMQ: what each answer means".
"""

import asyncio
import re

import aiormq

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.network_failures import WORDS, network_code
from outbox_pipelines.core.destinations.outcome_rows import OutcomeRow
from outbox_pipelines.core.models import Outcome, OutcomeKind
from outbox_pipelines.core.redaction import redact_text

# RabbitMQ's refusal of a body over max_message_size (it closes the channel with 406).
_TOO_LARGE = re.compile(r"message size (\d+) is larger than configured max size (\d+)")
# How the broker refuses a message by closing its channel: 406 PRECONDITION_FAILED (too large, mostly).
MESSAGE_REFUSED = aiormq.exceptions.ChannelPreconditionFailed

# The table, in the docs' order. Every outcome here is one of these rows'.
ACK = OutcomeRow("`basic.ack`", OutcomeKind.SENT)
RETURN = OutcomeRow(
    "`basic.return` (mandatory: no queue bound for the routing key)",
    OutcomeKind.DEAD,
    m.NO_SUBSCRIBERS,
    " (replay once a queue is bound)",
)
# How long after reconnecting a returned message is taken for a broker still restoring its bindings.
RECOVERY_GRACE_S = 30.0
RETURN_WHILE_RECOVERING = OutcomeRow(
    f"`basic.return` in the first {RECOVERY_GRACE_S:g} s of a connection that replaced an earlier one (the broker "
    "may have restarted, and still be restoring its queues' bindings)",
    OutcomeKind.RETRY,
    m.NO_SUBSCRIBERS,
)
NACK = OutcomeRow(
    "`basic.nack` (an internal error, a full queue with `x-overflow: reject-publish`)",
    OutcomeKind.RETRY,
    m.BROKER_5XX,
    " (circuit)",
)
BAD_MESSAGE = OutcomeRow(
    "a body over the broker's `max_message_size` (406, the channel is reopened and the rest of the batch goes on), "
    "any other 406 on publish; a routing key or message id over 255 bytes (refused before sending)",
    OutcomeKind.DEAD,
    m.BAD_REQUEST,
)
DENIED = OutcomeRow(
    "login refused (`ACCESS_REFUSED`), no access to the vhost or the exchange (403)",
    OutcomeKind.RETRY,
    m.UNAUTHORIZED,
    " (circuit)",
)
NO_ANSWER = OutcomeRow(
    "no connection or no confirm within `timeout`", OutcomeKind.RETRY, m.NETWORK_TIMEOUT, " (circuit)"
)
REFUSED = OutcomeRow(
    "connection refused: nothing listens at the broker's host and port",
    OutcomeKind.RETRY,
    m.CONNECTION_REFUSED,
    " (circuit)",
)
NAME_NOT_RESOLVED = OutcomeRow(
    "the broker's host name does not resolve (DNS)", OutcomeKind.RETRY, m.DNS_ERROR, " (circuit)"
)
TLS_FAILED = OutcomeRow(
    "the TLS handshake failed (`amqps`: a certificate that cannot be verified)",
    OutcomeKind.RETRY,
    m.TLS_ERROR,
    " (circuit)",
)
UNREACHABLE = OutcomeRow(
    "connection lost or closed; a server that does not speak AMQP", OutcomeKind.RETRY, m.CONNECTION_LOST, " (circuit)"
)
# A network failure's row, by its cause (network_failures.network_code).
_BY_CAUSE: dict[str, OutcomeRow] = {
    m.NETWORK_TIMEOUT: NO_ANSWER,
    m.CONNECTION_REFUSED: REFUSED,
    m.DNS_ERROR: NAME_NOT_RESOLVED,
    m.TLS_ERROR: TLS_FAILED,
}
OTHER = OutcomeRow(
    "anything else (an exchange of that name with another type; the exchange deleted: 404)",
    OutcomeKind.RETRY,
    m.UNKNOWN,
    " (circuit)",
)
ROWS = (
    ACK,
    RETURN,
    RETURN_WHILE_RECOVERING,
    NACK,
    BAD_MESSAGE,
    DENIED,
    NO_ANSWER,
    REFUSED,
    NAME_NOT_RESOLVED,
    TLS_FAILED,
    UNREACHABLE,
    OTHER,
)

SENT = ACK.outcome()
NACKED = NACK.outcome(
    "the broker refused the message (basic.nack): an internal error, or a queue that "
    "rejects publishes when full (x-overflow: reject-publish)"
)


def max_message_size(refusal: BaseException) -> int | None:
    """The broker's max_message_size, when its refusal names it ("message size 70000 is larger than
    configured max size 65536"), else None."""
    match = _TOO_LARGE.search(str(refusal))
    return int(match.group(2)) if match else None


def too_large(size: int, max_body: int | None) -> Outcome:
    return BAD_MESSAGE.outcome(
        f"the message body ({size} bytes) is larger than the broker's "
        f"max_message_size ({max_body} bytes): the broker refuses it"
    )


def refused(refusal: BaseException) -> Outcome:
    """The outcome of the message whose publish made the broker close the channel."""
    return BAD_MESSAGE.outcome(f"the broker refused the message: {reply_text(refusal)}")


def reply_text(exc: BaseException) -> str:
    """The broker's reply text of an aiormq error ('PRECONDITION_FAILED - message size ...'), else its str."""
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, str) and " - " in arg:
            return arg
    return f"{type(exc).__name__}: {exc}"


def returned(exc: aiormq.exceptions.PublishError, reconnected_s: float | None = None) -> Outcome:
    """The outcome of a message the broker returned; ``reconnected_s``: how long ago the connection replaced an
    earlier one (None: it is the destination's first)."""
    frame = exc.frame
    code, text = getattr(frame, "reply_code", None), getattr(frame, "reply_text", "")
    exchange, key = getattr(frame, "exchange", ""), getattr(frame, "routing_key", "")
    if reconnected_s is not None and reconnected_s < RECOVERY_GRACE_S:
        return RETURN_WHILE_RECOVERING.outcome(
            f"no queue is bound to exchange {exchange!r} for routing key {key!r} (the broker returned it: "
            f"{code} {text}) {reconnected_s:.1f} s into a new connection to it: a restarted broker may still be "
            "restoring its bindings; sent again at the next attempt"
        )
    return RETURN.outcome(
        f"no queue is bound to exchange {exchange!r} for routing key {key!r} "
        f"(the broker returned it: {code} {text}); bind the consumers' queue, then replay"
    )


def exception_outcome(exc: BaseException, timeout_s: float) -> Outcome:
    """The outcome of a publish that failed for the connection's or the broker's sake, not the message's."""
    text = redact_text(reply_text(exc))
    if isinstance(exc, TimeoutError):
        return NO_ANSWER.outcome(f"no confirm from the broker within {timeout_s:g} s")
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return DENIED.outcome(f"the broker refused the publish: {text}")
    if isinstance(
        exc,
        (
            aiormq.exceptions.AMQPConnectionError,
            aiormq.exceptions.ChannelInvalidStateError,
            ConnectionError,
            OSError,
            asyncio.CancelledError,
        ),
    ):
        row = _BY_CAUSE.get(network_code(exc) or "", UNREACHABLE)
        return row.outcome(f"the connection to the broker was lost: {text}")
    if isinstance(exc, aiormq.exceptions.ChannelClosed):
        return OTHER.outcome(f"the broker closed the channel: {text}")
    return OTHER.outcome(text)


def connect_outcome(exc: BaseException, exchange: str, timeout_s: float) -> Outcome:
    """The outcome of every message of a batch when connecting (or declaring the exchange) failed."""
    text = redact_text(reply_text(exc))
    if isinstance(exc, TimeoutError):
        return NO_ANSWER.outcome(f"could not connect to the broker within {timeout_s:g} s")
    if isinstance(exc, (aiormq.exceptions.AuthenticationError, aiormq.exceptions.ProbableAuthenticationError)):
        return DENIED.outcome(f"the broker refused the login: {text}")
    if isinstance(exc, aiormq.exceptions.ConnectionNotAllowed) or (
        isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc)
    ):
        # aiormq reports the broker's Connection.Close in answer to Connection.Open (530 NOT_ALLOWED) as an
        # unexpected frame: the user may not open the URL's vhost, or it does not exist.
        return DENIED.outcome(
            f"the broker refused to open the vhost (the user has no access to it, or it does not exist): {text}"
        )
    if isinstance(exc, (aiormq.exceptions.ProtocolSyntaxError, aiormq.exceptions.IncompatibleProtocolError)):
        return UNREACHABLE.outcome(f"the server does not answer as an AMQP 0-9-1 broker: {text}")
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return DENIED.outcome(f"the broker refused to declare exchange {exchange!r}: {text}")
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return OTHER.outcome(
            f"exchange {exchange!r} exists with another type or durability than a durable topic "
            f"exchange: {text}; delete it or set the table's exchange"
        )
    if isinstance(exc, (aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError)):
        row = _BY_CAUSE.get(network_code(exc) or "", UNREACHABLE)
        why = f"{WORDS[row.code or '']}: " if row is not UNREACHABLE else ""
        return row.outcome(f"could not connect to the broker: {why}{text}")
    return exception_outcome(exc, timeout_s)
