"""RabbitMQ destination: each message published to the table's exchange, ``sent`` only on the broker's ack.

The relay calls ``RabbitMQDestination`` (built by ``build``); publishes are persistent and mandatory, with
``message_id`` = the event_id, at most ``requests_in_flight`` awaiting their confirm. At least once; order is
the channel's publish order. Why aiormq, and the message's shape: docs/explanation/transports.md, "RabbitMQ".
"""

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import aiormq
from pamqp import commands as spec

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination, server_of
from outbox_pipelines.core.destinations.loop_thread import LoopThread, backstop_s
from outbox_pipelines.core.destinations.rabbitmq import outcomes as answers
from outbox_pipelines.core.destinations.rabbitmq.connection import ChannelKeeper, Ended
from outbox_pipelines.core.destinations.trace_context import context_headers
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import Scrubber, redact_text, split_credentials, unencoded_userinfo, url_origin

if TYPE_CHECKING:  # the settings type, for build()'s annotation only
    from outbox_pipelines.core.settings import TableSettings

# AMQP 0-9-1 short strings (routing key, message_id, exchange) hold at most 255 bytes.
MAX_SHORT_STRING = 255


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


class RabbitMQDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True
    messaging_system = "rabbitmq"

    def __init__(
        self,
        url: str,
        *,
        exchange: str,
        name: str | None = None,
        topic_prefix: str = "",
        timeout_s: float = 5.0,
        max_in_flight: int = 32,
    ) -> None:
        two_ways = unencoded_userinfo(url, "the RabbitMQ URL")  # the client would connect to a host out of the password
        if two_ways is not None:
            raise ConfigError(two_ways)
        self.url = url
        self.name = name or url_origin(url)
        self.scrub = Scrubber(url, credentials=split_credentials(url)[1])
        self.exchange = exchange
        self.topic_prefix = topic_prefix
        self.server = server_of(url, 5671 if url.startswith("amqps://") else 5672)
        self.timeout_s = timeout_s
        self.max_in_flight = max(1, max_in_flight)
        # The broker's max_message_size once a refusal named it: bodies over it are dead before sending.
        self.max_body: int | None = None
        self._channels = ChannelKeeper(url, exchange, timeout_s)
        self._lock = asyncio.Lock()  # one batch on the wire at a time, whoever calls
        self._loop = LoopThread(f"outbox-rabbitmq-{exchange}")

    # -- the relay's side -------------------------------------------------------------

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not messages:
            return []
        # Every wait inside is bounded by timeout_s (connect, each confirm); this is a last guard.
        waited = backstop_s(self.timeout_s)
        outcomes = self._loop.run_within(self._deliver(messages), waited)
        if outcomes is None:
            # Its state is unknown (confirms may still come for the abandoned publishes): the next batch connects anew.
            asyncio.run_coroutine_threadsafe(self._channels.drop(), self._loop.loop)
            return [Outcome.retry(m.NETWORK_TIMEOUT, f"no answer from {self.name} within {waited:g} s")] * len(messages)
        return outcomes

    def close(self) -> None:
        self._loop.stop(self._channels.drop())

    def destination_name(self, message: ClaimedMessage) -> str:
        """``{exchange}:{routing key}``, as the messaging conventions name a RabbitMQ destination."""
        routing_key = self.topic_prefix + message.topic
        if self.exchange and routing_key:
            return f"{self.exchange}:{routing_key}"
        return self.exchange or routing_key or "amq.default"

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
            return Outcome.dead(
                m.BAD_REQUEST,
                f"the routing key ({len(routing_key.encode())} bytes: topic_prefix + "
                f"topic {routing_key[:64]!r}...) is longer than AMQP's {MAX_SHORT_STRING} bytes",
            )
        if len(message.event_id.encode()) > MAX_SHORT_STRING:
            return Outcome.dead(
                m.BAD_REQUEST,
                f"the event_id ({len(message.event_id.encode())} bytes in UTF-8) is "
                f"longer than AMQP's {MAX_SHORT_STRING}-byte message_id",
            )
        try:
            body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            return Outcome.dead(m.BAD_REQUEST, redact_text(f"the payload cannot be sent as JSON: {exc}"))
        if self.max_body is not None and len(body) > self.max_body:
            return answers.too_large(len(body), self.max_body)
        # What the spec asks for and nothing more: every header and property costs encoding time per message.
        headers: dict[str, Any] = {"Idempotency-Key": message.event_id, **context_headers(message)}
        properties = spec.Basic.Properties(
            content_type="application/json", delivery_mode=2, message_id=message.event_id, headers=headers
        )
        return _Publish(index, body, routing_key, properties)

    async def _publish(self, publishes: list[_Publish]) -> None:
        """Publish until every message has an outcome. When the broker closes the channel because of a
        message (406), the culprit is dead and the rest goes again on a new channel."""
        pending = publishes
        one_at_a_time = False
        try:
            while pending:
                channel = await self._channels.ready()
                ended = await self._round(channel, pending, 1 if one_at_a_time else self.max_in_flight)
                if ended is None:
                    return
                refusal = next((p.error for p in pending if isinstance(p.error, answers.MESSAGE_REFUSED)), None)
                if refusal is None:
                    raise Ended(
                        answers.exception_outcome(ended, self.timeout_s),
                        drop_connection=not isinstance(ended, aiormq.exceptions.ChannelClosed),
                    )
                # Publishes queued behind the refused one reach the broker after it closed the channel, and it
                # closes the connection for them (504 CHANNEL_ERROR), maybe only after a new channel opened on it:
                # the rest goes on a new connection.
                await self._channels.drop()
                found = self._culprits(pending, one_at_a_time, refusal)
                if one_at_a_time and not found:  # a refusal no message of the batch explains: do not loop
                    raise Ended(answers.exception_outcome(ended, self.timeout_s), drop_connection=False)
                # Progress every round: a culprit dead, or (none named) the rest sent one at a time, which names it.
                one_at_a_time = not found
                pending = [p for p in pending if p.outcome is None]
                for publish in pending:
                    publish.error = None
        except Ended as ended_by:
            for publish in pending:
                if publish.outcome is None:
                    publish.outcome = ended_by.outcome
            if ended_by.drop_connection:
                await self._channels.drop()

    def _culprits(self, pending: list[_Publish], one_at_a_time: bool, refusal: BaseException) -> bool:
        """Mark dead the messages that made the broker close the channel; False when none could be named."""
        max_body = answers.max_message_size(refusal)
        if max_body is not None:  # kept for later batches
            self.max_body = max_body
        found = False
        for publish in pending:
            if publish.outcome is not None:
                continue
            if one_at_a_time and isinstance(publish.error, aiormq.exceptions.ChannelPreconditionFailed):
                # Alone on the wire when the broker closed the channel: this message is the cause.
                publish.outcome = answers.refused(refusal)
                found = True
            elif self.max_body is not None and len(publish.body) > self.max_body:
                publish.outcome = answers.too_large(len(publish.body), self.max_body)
                found = True
        return found

    async def _round(self, channel: aiormq.Channel, pending: list[_Publish], lanes: int) -> BaseException | None:
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
                    await channel.basic_publish(
                        publish.body,
                        exchange=self.exchange,
                        routing_key=publish.routing_key,
                        properties=publish.properties,
                        mandatory=True,
                        wait=False,
                    )
                    publish.outcome = answers.SENT
                except aiormq.exceptions.PublishError as exc:  # a subclass of DeliveryError: first
                    publish.outcome = answers.returned(exc, self._channels.reconnected_s())
                except aiormq.exceptions.DeliveryError:
                    publish.outcome = answers.NACKED
                except Exception as exc:  # the channel or the connection is gone
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

    def _scrubbed(self, outcome: Outcome) -> Outcome:
        return replace(outcome, error=self.scrub(outcome.error)) if outcome.error else outcome


def build(table: "TableSettings") -> RabbitMQDestination:
    """The destination of a ``destination = "rabbitmq"`` table (wiring.build_broker_destination)."""
    broker = table.broker
    assert broker is not None and broker.kind == "rabbitmq"
    return RabbitMQDestination(
        broker.url,
        exchange=broker.exchange or table.name,
        name=broker.shown,
        topic_prefix=broker.topic_prefix,
        timeout_s=table.timeout_s,
        max_in_flight=table.requests_in_flight,
    )
