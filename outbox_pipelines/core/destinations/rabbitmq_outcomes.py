"""What each answer of a RabbitMQ broker, and each failure of the AMQP client (aiormq), means for a
message: the RabbitMQ destination's outcome table.

Outcomes (each error text has the URL's credentials scrubbed by the destination, which is named by its origin):
- basic.ack -> sent;
- basic.return (mandatory: no queue is bound for the routing key) -> dead NO_SUBSCRIBERS: the
  consumers' binding is missing; replay (no --force needed) once it exists. Not a retry: the message
  would go nowhere again until someone binds a queue, and retries would burn its attempts meanwhile;
- basic.nack (the broker could not take it: an internal error, a queue with ``x-overflow:
  reject-publish`` that is full) -> retry BROKER_5XX (counts toward the table's circuit);
- a body over the broker's ``max_message_size`` (the broker closes the channel: 406 PRECONDITION_FAILED)
  -> dead BAD_REQUEST; the rest of the batch is published again on a new connection (publishes queued
  behind the refused one make the broker close the connection too: 504), and the limit read from the
  broker's refusal is kept, so later bodies over it are refused before sending;
  any other 406 on publish (a precondition of this message) -> dead BAD_REQUEST likewise, the culprit
  found by publishing the unconfirmed rest one at a time;
- a routing key or message_id over 255 bytes (AMQP short strings) -> dead BAD_REQUEST, before sending;
- authentication refused (ACCESS_REFUSED at login), the user may not open the vhost, or may not
  declare / publish to the exchange (403) -> retry UNAUTHORIZED (counts toward the circuit);
- connection refused, lost or closed by the broker, a server that does not speak AMQP, no connection
  within the table's ``timeout``, no answer to any publish of the batch for ``timeout`` -> retry
  NETWORK_TIMEOUT (counts toward the circuit): a broker that is down or hung answers every delivery
  within about the table's timeout, and opens the circuit (no attempt spent, nothing dead);
- anything else (the exchange deleted under us: 404) -> retry UNKNOWN.
"""

import asyncio
import re

import aiormq

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.redaction import redact_text

# RabbitMQ's refusal of a body over max_message_size (it closes the channel with 406).
_TOO_LARGE = re.compile(r"message size (\d+) is larger than configured max size (\d+)")
# How the broker refuses a message by closing its channel: 406 PRECONDITION_FAILED (too large, mostly).
MESSAGE_REFUSED = aiormq.exceptions.ChannelPreconditionFailed

SENT = Outcome.sent()
NACKED = Outcome.retry(m.BROKER_5XX, "the broker refused the message (basic.nack): an internal error, or a queue "
                       "that rejects publishes when full (x-overflow: reject-publish)")


def max_message_size(refusal: BaseException) -> int | None:
    """The broker's max_message_size, when its refusal names it ("message size 70000 is larger than
    configured max size 65536"), else None."""
    match = _TOO_LARGE.search(str(refusal))
    return int(match.group(2)) if match else None


def too_large(size: int, max_body: int | None) -> Outcome:
    return Outcome.dead(m.BAD_REQUEST, f"the message body ({size} bytes) is larger than the broker's "
                        f"max_message_size ({max_body} bytes): the broker refuses it")


def refused(refusal: BaseException) -> Outcome:
    """The outcome of the message whose publish made the broker close the channel."""
    return Outcome.dead(m.BAD_REQUEST, f"the broker refused the message: {reply_text(refusal)}")


def reply_text(exc: BaseException) -> str:
    """The broker's reply text of an aiormq error ('PRECONDITION_FAILED - message size ...'), else its str."""
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, str) and " - " in arg:
            return arg
    return f"{type(exc).__name__}: {exc}"


def returned(exc: aiormq.exceptions.PublishError) -> Outcome:
    frame = exc.frame
    code, text = getattr(frame, "reply_code", None), getattr(frame, "reply_text", "")
    exchange, key = getattr(frame, "exchange", ""), getattr(frame, "routing_key", "")
    return Outcome.dead(m.NO_SUBSCRIBERS, f"no queue is bound to exchange {exchange!r} for routing key {key!r} "
                        f"(the broker returned it: {code} {text}); bind the consumers' queue, then replay")


def exception_outcome(exc: BaseException, timeout_s: float) -> Outcome:
    """The outcome of a publish that failed for the connection's or the broker's sake, not the message's."""
    text = redact_text(reply_text(exc))
    if isinstance(exc, TimeoutError):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"no confirm from the broker within {timeout_s:g} s")
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return Outcome.retry(m.UNAUTHORIZED, f"the broker refused the publish: {text}")
    if isinstance(exc, (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError,
                        ConnectionError, OSError, asyncio.CancelledError)):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"the connection to the broker was lost: {text}")
    if isinstance(exc, aiormq.exceptions.ChannelClosed):
        return Outcome.retry(m.UNKNOWN, f"the broker closed the channel: {text}")
    return Outcome.retry(m.UNKNOWN, text)


def connect_outcome(exc: BaseException, exchange: str, timeout_s: float) -> Outcome:
    """The outcome of every message of a batch when connecting (or declaring the exchange) failed."""
    text = redact_text(reply_text(exc))
    if isinstance(exc, TimeoutError):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"could not connect to the broker within {timeout_s:g} s")
    if isinstance(exc, (aiormq.exceptions.AuthenticationError, aiormq.exceptions.ProbableAuthenticationError)):
        return Outcome.retry(m.UNAUTHORIZED, f"the broker refused the login: {text}")
    if isinstance(exc, aiormq.exceptions.ConnectionNotAllowed) or (
            isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc)):
        # aiormq reports the broker's Connection.Close in answer to Connection.Open (530 NOT_ALLOWED) as an
        # unexpected frame: the user may not open the URL's vhost, or it does not exist.
        return Outcome.retry(m.UNAUTHORIZED, f"the broker refused to open the vhost (the user has no access to it, "
                             f"or it does not exist): {text}")
    if isinstance(exc, (aiormq.exceptions.ProtocolSyntaxError, aiormq.exceptions.IncompatibleProtocolError)):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"the server does not answer as an AMQP 0-9-1 broker: {text}")
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return Outcome.retry(m.UNAUTHORIZED, f"the broker refused to declare exchange {exchange!r}: {text}")
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return Outcome.retry(m.UNKNOWN, f"exchange {exchange!r} exists with another type or durability than a "
                             f"durable topic exchange: {text}; delete it or set the table's exchange")
    if isinstance(exc, (aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError)):
        return Outcome.retry(m.NETWORK_TIMEOUT, f"could not connect to the broker: {text}")
    return exception_outcome(exc, timeout_s)
