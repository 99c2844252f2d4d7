"""RabbitMQ destination: each message published to the table's exchange, ``sent`` only on the broker's ack.

Client: aiormq, the AMQP 0-9-1 client aio-pika is built on (installed with aio-pika), on a private event
loop (``LoopThread``). Measured on 2 cores against RabbitMQ 3.10, 10,000 confirmed persistent mandatory
publishes of ~250 bytes of JSON (serialised in the loop), medians of 4 interleaved runs:

- pika's BlockingConnection in confirm mode: 2,650 msg/s. It waits for each confirm before the next
  publish (it cannot keep publishes in flight), so it is out;
- aio-pika's ``Exchange.publish``, 32 in flight: 4,900 msg/s, 150 us of client CPU a message;
- aiormq's ``Channel.basic_publish``, 32 in flight: 4,660 msg/s, 152 us a message: the same cost.

aiormq, because the destination needs what aio-pika's layer wraps or leaves out: the broker's reason on
every publish a channel close failed (to find which message a 406 was about), ``wait=False`` (no wait for
the socket to drain: the confirm is what counts), and a connection of its own making (aio-pika's robust
connection reconnects in the background and replays declarations; here a lost connection fails the batch
at once and the next batch connects anew).

Where a message goes: exchange ``BrokerSettings.exchange`` (the table's name unless set), declared
durable, type ``topic`` at connect (idempotent; an exchange of that name of another type or durability
is refused by the broker: retry UNKNOWN naming the conflict), routing key the message's topic with the
table's ``topic_prefix`` in front, as written (``prod.`` + ``order.created``). Published ``mandatory`` and
persistent (delivery_mode 2), content_type application/json, ``message_id`` = the event_id, and headers
``Idempotency-Key`` (the event_id again, as the HTTP destination sends it), with ``traceparent``,
``X-Trace-Id`` and ``X-Tenant-Id`` when the message has them. Nothing more: the topic is in the routing
key, and every property costs encoding time per message (measured: the HTTP destination's four headers
and a timestamp cost about a tenth of the publish's CPU).

Outcomes (each error text has the URL's credentials scrubbed; the destination is named by its origin):
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

Connection: one connection and one confirm-mode channel, opened at the first delivery and kept across
batches; a lost connection (or a timeout, after which its state is unknown) is dropped, the rest of
its batch is not attempted, and the next batch opens a new one. A batch keeps ``requests_in_flight``
publishes awaiting their confirm at once (lanes publishing in batch order on the one channel: a sliding
window, measured 1.3x a loop that publishes 32 and waits for their confirms).

Duplicates: at least once. A publish whose ack was lost (the connection dropped after the broker took
it; the channel closed for another message of its batch) is retried and may reach the queue twice;
consumers deduplicate by ``message_id`` (the event_id).
Order: publishes go out on one channel in batch order, and RabbitMQ keeps a channel's publish order
into each queue; a retried message lands after those published since. A table's ordering keys are kept
by the relay (one message of a key in flight at a time), not here.
"""

import asyncio
import json
import logging
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import aiormq
import aiormq.abc
from pamqp import commands as spec

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.loop_thread import LoopThread
from outbox_pipelines.core.destinations.trace_context import trace_headers
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import Scrubber, redact_text, split_credentials, url_origin

if TYPE_CHECKING:  # the settings type, for build()'s annotation only
    from outbox_pipelines.core.settings import TableSettings

log = logging.getLogger("outbox_pipelines.destinations.rabbitmq")

# AMQP 0-9-1 short strings (routing key, message_id, exchange) hold at most 255 bytes.
MAX_SHORT_STRING = 255
# RabbitMQ's refusal of a body over max_message_size (it closes the channel with 406).
_TOO_LARGE = re.compile(r"message size (\d+) is larger than configured max size (\d+)")
# How the broker refuses a message by closing its channel: 406 PRECONDITION_FAILED (too large, mostly).
_MESSAGE_REFUSED = aiormq.exceptions.ChannelPreconditionFailed


@dataclass
class _Publish:
    """One message ready for the wire, and where its outcome goes in the batch."""

    index: int
    body: bytes
    routing_key: str
    properties: spec.Basic.Properties
    outcome: Outcome | None = None
    # Why its publish got no answer (the channel or the connection went, a timeout); None once answered.
    error: BaseException | None = None


class _Ended(Exception):
    """The round's channel or connection is gone: every publish without an outcome ends as ``outcome``."""

    def __init__(self, outcome: Outcome, drop_connection: bool) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome
        self.drop_connection = drop_connection


class RabbitMQDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True

    def __init__(self, url: str, *, exchange: str, name: str | None = None, topic_prefix: str = "",
                 timeout_s: float = 5.0, max_in_flight: int = 32) -> None:
        self.url = url
        self.name = name or url_origin(url)
        self.scrub = Scrubber(url, credentials=split_credentials(url)[1])
        self.exchange = exchange
        self.topic_prefix = topic_prefix
        self.timeout_s = timeout_s
        self.max_in_flight = max(1, max_in_flight)
        # The broker's max_message_size once a refusal named it: bodies over it are dead before sending.
        self.max_body: int | None = None
        self._connection: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.Channel | None = None
        self._lock = asyncio.Lock()  # one batch on the wire at a time, whoever calls
        self._loop = LoopThread(f"outbox-rabbitmq-{exchange}")

    # -- the relay's side -------------------------------------------------------------

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not messages:
            return []
        future = asyncio.run_coroutine_threadsafe(self._deliver(messages), self._loop.loop)
        try:
            # Every wait inside is bounded by timeout_s (connect, each confirm); this is a last guard.
            return future.result(timeout=3 * self.timeout_s + 10)
        except FutureTimeout:
            future.cancel()
            # Its state is unknown (confirms may still come for the abandoned publishes): the next batch connects anew.
            asyncio.run_coroutine_threadsafe(self._drop_connection(), self._loop.loop)
            waited = 3 * self.timeout_s + 10
            return [Outcome.retry(m.NETWORK_TIMEOUT, f"no answer from {self.name} within {waited:g} s")] * len(messages)

    def close(self) -> None:
        self._loop.stop(self._drop_connection())

    # -- a batch ----------------------------------------------------------------------

    async def _deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        async with self._lock:
            publishes: list[_Publish] = []
            outcomes: list[Outcome | None] = [None] * len(messages)
            for index, message in enumerate(messages):
                prepared = self._prepare(index, message)
                if isinstance(prepared, Outcome):
                    outcomes[index] = prepared
                else:
                    publishes.append(prepared)
            await self._publish(publishes)
            for publish in publishes:
                outcomes[publish.index] = publish.outcome
            return [self._scrubbed(o) if o is not None else Outcome.retry(m.UNKNOWN, "no outcome") for o in outcomes]

    def _prepare(self, index: int, message: ClaimedMessage) -> _Publish | Outcome:
        """The message as it goes on the wire, or dead BAD_REQUEST when the broker cannot take it."""
        routing_key = self.topic_prefix + message.topic
        if len(routing_key.encode()) > MAX_SHORT_STRING:
            return Outcome.dead(m.BAD_REQUEST, f"the routing key ({len(routing_key.encode())} bytes: topic_prefix + "
                                f"topic {routing_key[:64]!r}...) is longer than AMQP's {MAX_SHORT_STRING} bytes")
        if len(message.event_id.encode()) > MAX_SHORT_STRING:
            return Outcome.dead(m.BAD_REQUEST, f"the event_id ({len(message.event_id.encode())} bytes in UTF-8) is "
                                f"longer than AMQP's {MAX_SHORT_STRING}-byte message_id")
        try:
            body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            return Outcome.dead(m.BAD_REQUEST, redact_text(f"the payload cannot be sent as JSON: {exc}"))
        if self.max_body is not None and len(body) > self.max_body:
            return self._too_large(len(body))
        # What the spec asks for and nothing more: every header and property costs encoding time per message.
        headers: dict[str, Any] = {"Idempotency-Key": message.event_id, **trace_headers(message)}
        if message.trace_id:
            headers["X-Trace-Id"] = message.trace_id
        if message.tenant_id:
            headers["X-Tenant-Id"] = message.tenant_id
        properties = spec.Basic.Properties(content_type="application/json", delivery_mode=2,
                                           message_id=message.event_id, headers=headers)
        return _Publish(index, body, routing_key, properties)

    def _too_large(self, size: int) -> Outcome:
        return Outcome.dead(m.BAD_REQUEST, f"the message body ({size} bytes) is larger than the broker's "
                            f"max_message_size ({self.max_body} bytes): the broker refuses it")

    async def _publish(self, publishes: list[_Publish]) -> None:
        """Publish until every message has an outcome. When the broker closes the channel because of a
        message (406), the culprit is dead and the rest goes again on a new channel."""
        pending = publishes
        one_at_a_time = False
        try:
            while pending:
                channel = await self._ready_channel()
                ended = await self._round(channel, pending, 1 if one_at_a_time else self.max_in_flight)
                if ended is None:
                    return
                refusal = next((p.error for p in pending if isinstance(p.error, _MESSAGE_REFUSED)), None)
                if refusal is None:
                    raise _Ended(_exception_outcome(ended, self.timeout_s),
                                 drop_connection=not isinstance(ended, aiormq.exceptions.ChannelClosed))
                # Publishes queued behind the refused one reach the broker after it closed the channel, and it
                # closes the connection for them (504 CHANNEL_ERROR), maybe only after a new channel opened on it:
                # the rest goes on a new connection.
                await self._drop_connection()
                found = self._culprits(pending, one_at_a_time, refusal)
                if one_at_a_time and not found:  # a refusal no message of the batch explains: do not loop
                    raise _Ended(_exception_outcome(ended, self.timeout_s), drop_connection=False)
                # Progress every round: a culprit dead, or (none named) the rest sent one at a time, which names it.
                one_at_a_time = not found
                pending = [p for p in pending if p.outcome is None]
                for publish in pending:
                    publish.error = None
        except _Ended as ended_by:
            for publish in pending:
                if publish.outcome is None:
                    publish.outcome = ended_by.outcome
            if ended_by.drop_connection:
                await self._drop_connection()

    def _culprits(self, pending: list[_Publish], one_at_a_time: bool, refusal: BaseException) -> bool:
        """Mark dead the messages that made the broker close the channel; False when none could be named."""
        match = _TOO_LARGE.search(str(refusal))
        if match:  # "message size 70000 is larger than configured max size 65536": kept for later batches
            self.max_body = int(match.group(2))
        found = False
        for publish in pending:
            if publish.outcome is not None:
                continue
            if one_at_a_time and isinstance(publish.error, aiormq.exceptions.ChannelPreconditionFailed):
                # Alone on the wire when the broker closed the channel: this message is the cause.
                publish.outcome = Outcome.dead(m.BAD_REQUEST, f"the broker refused the message: {_reply_text(refusal)}")
                found = True
            elif self.max_body is not None and len(publish.body) > self.max_body:
                publish.outcome = self._too_large(len(publish.body))
                found = True
        return found

    async def _round(self, channel: aiormq.Channel, pending: list[_Publish],
                     lanes: int) -> BaseException | None:
        """Publish ``pending`` in order with up to ``lanes`` confirms awaited at once; the failure that ended
        the channel or connection (publishing stops at the first), or None when every publish was answered.

        One watchdog for the round, not a timer per publish (a tenth of the destination's CPU): when no
        answer came for ``timeout_s``, the publishes still waiting end as a timeout."""
        queue: Iterator[_Publish] = iter(pending)
        ended: list[BaseException] = []
        loop = asyncio.get_running_loop()
        answered = [loop.time()]  # when the broker last answered a publish of this round

        async def lane() -> None:
            for publish in queue:
                if ended:
                    return
                try:
                    # wait=False: no wait for the socket write to drain; the confirm is what is awaited.
                    await channel.basic_publish(publish.body, exchange=self.exchange, routing_key=publish.routing_key,
                                                properties=publish.properties, mandatory=True, wait=False)
                    publish.outcome = _SENT
                except aiormq.exceptions.PublishError as exc:  # a subclass of DeliveryError: first
                    publish.outcome = _returned(exc)
                except aiormq.exceptions.DeliveryError:
                    publish.outcome = _NACKED
                except Exception as exc:  # noqa: BLE001 - the channel or the connection is gone
                    publish.error = exc
                    ended.append(exc)
                answered[0] = loop.time()

        work = asyncio.gather(*(lane() for _ in range(min(lanes, len(pending)))))
        while not work.done():
            await asyncio.wait({work}, timeout=max(0.0, answered[0] + self.timeout_s - loop.time()))
            if not work.done() and loop.time() - answered[0] >= self.timeout_s:
                ended.append(TimeoutError(f"no confirm within {self.timeout_s:g} s"))
                work.cancel()
                await asyncio.wait({work})
        if not ended and not work.cancelled() and work.exception() is not None:
            # A lane ended by a cancellation its client raised (a channel closing under it): as a lost channel.
            ended.append(work.exception() or ConnectionError("publishing stopped"))
        if not ended:
            return None
        # The broker's own reason (its channel.close or connection.close) over "channel closed" seen after it.
        return next((e for e in ended if not isinstance(e, aiormq.exceptions.ChannelInvalidStateError)), ended[0])

    def _connection_lost(self) -> bool:
        return self._connection is None or self._connection.is_closed

    # -- the connection -------------------------------------------------------------

    async def _ready_channel(self) -> aiormq.Channel:
        """The open confirm channel, connecting and declaring the exchange first if needed; _Ended if not."""
        if self._channel is not None and not self._channel.is_closed and not self._connection_lost():
            return self._channel
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._connection_lost():
                    await self._drop_connection()
                    self._connection = await aiormq.connect(
                        self.url, client_properties={"connection_name": f"outbox-pipelines {self.exchange}"})
                assert self._connection is not None
                channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
                assert isinstance(channel, aiormq.Channel)  # the concrete class: its basic_publish takes wait=
                await channel.exchange_declare(self.exchange, exchange_type="topic", durable=True)
        except Exception as exc:  # noqa: BLE001 - an outcome for every pending message
            raise _Ended(_connect_outcome(exc, self.exchange, self.timeout_s), drop_connection=True) from None
        self._channel = channel
        return channel

    async def _drop_connection(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is None or connection.is_closed:
            return
        try:
            await asyncio.wait_for(connection.close(), 1.0)
        except Exception:  # noqa: BLE001 - a connection that will not close politely is abandoned
            log.debug("closing the RabbitMQ connection failed", exc_info=True)

    def _scrubbed(self, outcome: Outcome) -> Outcome:
        return replace(outcome, error=self.scrub(outcome.error)) if outcome.error else outcome


_SENT = Outcome.sent()
_NACKED = Outcome.retry(m.BROKER_5XX, "the broker refused the message (basic.nack): an internal error, or a queue "
                        "that rejects publishes when full (x-overflow: reject-publish)")


def _reply_text(exc: BaseException) -> str:
    """The broker's reply text of an aiormq error ('PRECONDITION_FAILED - message size ...'), else its str."""
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, str) and " - " in arg:
            return arg
    return f"{type(exc).__name__}: {exc}"


def _returned(exc: aiormq.exceptions.PublishError) -> Outcome:
    frame = exc.frame
    code, text = getattr(frame, "reply_code", None), getattr(frame, "reply_text", "")
    exchange, key = getattr(frame, "exchange", ""), getattr(frame, "routing_key", "")
    return Outcome.dead(m.NO_SUBSCRIBERS, f"no queue is bound to exchange {exchange!r} for routing key {key!r} "
                        f"(the broker returned it: {code} {text}); bind the consumers' queue, then replay")


def _exception_outcome(exc: BaseException, timeout_s: float) -> Outcome:
    """The outcome of a publish that failed for the connection's or the broker's sake, not the message's."""
    text = redact_text(_reply_text(exc))
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


def _connect_outcome(exc: BaseException, exchange: str, timeout_s: float) -> Outcome:
    """The outcome of every message of a batch when connecting (or declaring the exchange) failed."""
    text = redact_text(_reply_text(exc))
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
    return _exception_outcome(exc, timeout_s)


def build(table: "TableSettings") -> RabbitMQDestination:
    """The destination of a ``destination = "rabbitmq"`` table (wiring.build_broker_destination)."""
    broker = table.broker
    assert broker is not None and broker.kind == "rabbitmq"
    return RabbitMQDestination(broker.url, exchange=broker.exchange or table.name, name=broker.shown,
                               topic_prefix=broker.topic_prefix, timeout_s=table.timeout_s,
                               max_in_flight=table.requests_in_flight)
