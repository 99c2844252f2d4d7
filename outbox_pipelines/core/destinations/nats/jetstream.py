"""NATS JetStream destination: each message published to a stream, ``sent`` only on the stream's PubAck.

The relay calls ``NatsJetStreamDestination`` (built by ``build``); ``Nats-Msg-Id`` is the event_id, at most the
table's ``concurrency`` publishes await their acks. Duplicates, order and why acks are read this way:
docs/explanation/transports.md, "NATS JetStream".
"""

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination, server_of
from outbox_pipelines.core.destinations.loop_thread import LoopThread, backstop_s
from outbox_pipelines.core.destinations.nats.connection import Batch, ConnectFailed, Connection, Connector, Sent
from outbox_pipelines.core.destinations.nats.outcomes import NO_RESPONDERS, NatsOutcomes
from outbox_pipelines.core.destinations.nats.wire import Prepared, Wire, too_large
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import (
    Scrubber,
    mask_url,
    redact_text,
    split_credentials,
    unencoded_userinfo,
    url_origin,
)

if TYPE_CHECKING:  # the settings type, for build()'s annotation only
    from outbox_pipelines.core.settings import TableSettings

log = logging.getLogger("outbox_pipelines.destinations.nats")

# How often a batch waiting for acks checks that its connection is still open.
CLOSED_CHECK_S = 0.2


class _Window:
    """At most ``size`` messages awaiting their acks. Once full, publishing resumes when half of them are
    answered, not at each answer: the messages then leave in one socket write (each write is a system call
    and a wake-up of the server), not one write per ack."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.low = size // 2
        self.in_flight = 0
        self._room = asyncio.Event()

    @property
    def full(self) -> bool:
        return self.in_flight >= self.size

    def add(self, future: "asyncio.Future[Outcome]") -> None:
        self.in_flight += 1
        future.add_done_callback(self._answered)

    def _answered(self, _: "asyncio.Future[Outcome]") -> None:
        self.in_flight -= 1
        if self.in_flight <= self.low:
            self._room.set()

    async def room(self) -> None:
        self._room.clear()
        await self._room.wait()


class NatsJetStreamDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True
    messaging_system = "nats"

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        token: str | None = None,
        topic_prefix: str = "",
        timeout_s: float = 5.0,
        max_in_flight: int = 32,
        client_name: str = "outbox-pipelines",
    ) -> None:
        shown = mask_url(url)
        if not url.startswith(("nats://", "tls://")):
            raise ConfigError(f"a NATS URL starts with nats:// or tls://, got {shown!r}")
        two_ways = unencoded_userinfo(url, "the NATS URL")
        if two_ways is not None:
            raise ConfigError(two_ways)
        try:
            server, credentials = split_credentials(url)
        except ValueError as exc:
            raise ConfigError(f"NATS URL {shown!r} is not a valid URL: {redact_text(str(exc))}") from None
        if credentials is not None and token:
            raise ConfigError(
                f"NATS {url_origin(server)}: the URL carries user:password and a token (token_env) is "
                "set too; a connection authenticates one way: keep one"
            )
        self.name = redact_text(name) if name else url_origin(server)
        self.scrub = Scrubber(url, token=token, credentials=credentials)
        self.topic_prefix = topic_prefix
        self.server = server_of(server, 4222)
        self.timeout_s = timeout_s
        self.max_in_flight = max(1, max_in_flight)
        self.client_name = client_name
        self._wire = Wire(topic_prefix)
        self._outcomes = NatsOutcomes(self.name, self.scrub, timeout_s)
        self._connector = Connector(
            server,
            credentials=credentials,
            token=token,
            client_name=client_name,
            timeout_s=timeout_s,
            outcomes=self._outcomes,
        )
        self._loop = LoopThread("outbox-nats")
        self._loop.loop.set_exception_handler(self._loop_exception)

    def destination_name(self, message: ClaimedMessage) -> str:
        return self.topic_prefix + message.topic  # the subject

    # -- one delivery ----------------------------------------------------------

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not messages:
            return []
        backstop = backstop_s(self.timeout_s)
        # Bounded by the connect and ack timeouts inside; the backstop only guards against a stuck loop.
        outcomes = self._loop.run_within(self._deliver(messages), backstop)
        if outcomes is None:
            return [Outcome.retry(m.NETWORK_TIMEOUT, f"no answer from NATS {self.name} in {backstop:g} s")] * len(
                messages
            )
        return outcomes

    async def _deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(messages)
        prepared = [self._wire.prepare(message) for message in messages]
        try:
            conn = await self._connector.connection()
        except ConnectFailed as failed:
            return [item if isinstance(item, Outcome) else failed.outcome for item in prepared]
        batch = Batch()
        conn.batches.add(batch)
        try:
            await self._publish(conn, batch, prepared, outcomes)
            await self._collect(conn, batch, outcomes)
        finally:
            conn.batches.discard(batch)
            if batch.timer is not None:
                batch.timer.cancel()
            for item in batch.sent:
                conn.waiting.pop(item.token, None)
        if batch.stalled:
            self._connector.drop(conn)  # acks stopped coming on a connection that looks open: do not trust it
        return [o if o is not None else Outcome.retry(m.UNKNOWN, "no outcome") for o in outcomes]

    async def _publish(
        self, conn: Connection, batch: Batch, prepared: list[Prepared | Outcome], outcomes: list[Outcome | None]
    ) -> None:
        """Publish each message, at most ``max_in_flight`` awaiting their acks; stop sending (retry the
        rest, unsent) once the connection fails or an ack is overdue."""
        loop = asyncio.get_running_loop()
        window = _Window(self.max_in_flight)
        stopped: Outcome | None = None
        nc, inbox, waiting, tokens = conn.nc, conn.inbox, conn.waiting, conn.tokens
        max_payload, timeout, no_ack = nc.max_payload, self.timeout_s, self._outcomes.no_ack

        for index, item in enumerate(prepared):
            if isinstance(item, Outcome):
                outcomes[index] = item
                continue
            if stopped is None and (batch.stalled or conn.denied is not None):
                stopped = (
                    self._outcomes.denied(conn.denied)
                    if conn.denied
                    else replace(no_ack, error=f"not sent: {no_ack.error} for a message before it")
                )
            if stopped is not None:
                outcomes[index] = stopped
                continue
            subject, payload, headers = item
            size = too_large(payload, headers, max_payload)
            if size is not None:
                outcomes[index] = Outcome.dead(
                    m.BAD_REQUEST,
                    f"not published: {size:,} bytes with headers, more "
                    f"than the server's max_payload ({max_payload:,} bytes)",
                )
                continue
            if window.full:
                await window.room()  # the ack watchdog ends the oldest wait by its deadline at the latest
            token = str(next(tokens))
            future: asyncio.Future[Outcome] = loop.create_future()
            waiting[token] = future
            try:
                await nc.publish(subject, payload, reply=inbox + token, headers=headers)
            except Exception as exc:  # a refused publish is this message's outcome
                waiting.pop(token, None)
                outcome = outcomes[index] = self._outcomes.exception(exc)
                if outcome.code in m.NETWORK_FAILURES:
                    stopped = replace(outcome, error=f"not sent: {outcome.error}")
                    if nc.is_closed:
                        conn.fail(self._outcomes.closed)  # what waits on it now, not at the next check
                continue
            window.add(future)
            batch.sent.append(Sent(index, subject, token, future, loop.time() + timeout))
            if batch.timer is None:
                self._watch(conn, batch)

    def _watch(self, conn: Connection, batch: Batch) -> None:
        """The ack watchdog: ends each message's wait once its PubAck is overdue (deadlines grow in publish
        order, so one timer, set for the oldest message still waiting, serves the whole batch), and every
        wait at once when the connection is closed (nats-py does not always call closed_cb: its close
        stops at a broken pipe while flushing)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        batch.timer = None
        if conn.nc.is_closed:
            conn.fail(self._outcomes.closed)
        while batch.watched < len(batch.sent):
            item = batch.sent[batch.watched]
            if not item.future.done():
                if item.deadline > now:
                    batch.timer = loop.call_at(min(item.deadline, now + CLOSED_CHECK_S), self._watch, conn, batch)
                    return
                conn.settle(item, self._outcomes.no_ack)
                batch.stalled = True
            batch.watched += 1

    async def _collect(self, conn: Connection, batch: Batch, outcomes: list[Outcome | None]) -> None:
        """Each published message's outcome, once its ack (or failure) is in."""
        unrouted: dict[str, list[int]] = {}
        for item in batch.sent:
            outcome = await item.future  # always ends: an ack, the watchdog, or the connection's close
            if outcome is NO_RESPONDERS:
                unrouted.setdefault(item.subject, []).append(item.index)
            else:
                outcomes[item.index] = outcome
        for subject, indexes in unrouted.items():
            outcome = await self._outcomes.no_responders(conn.nc, subject)
            for index in indexes:
                outcomes[index] = outcome

    # -- the private loop ------------------------------------------------------

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """nats-py's background tasks of a connection lost abruptly end with errors nobody awaits (a read
        loop's BrokenPipeError): the outcomes say what failed, so these are debug lines, scrubbed."""
        exc = context.get("exception")
        text = f"{type(exc).__name__}: {exc}" if exc is not None else str(context.get("message"))
        log.debug("NATS %s client: %s", self.name, self.scrub(text))

    def close(self) -> None:
        async def closing() -> None:
            await self._connector.close()
            # What nats-py left running after an abrupt close (its subscriptions' readers): ended, not
            # destroyed pending with the loop.
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in others:
                task.cancel()
            if others:
                await asyncio.wait(others, timeout=2.0)

        self._loop.stop(closing())


def build(table: "TableSettings") -> NatsJetStreamDestination:
    """The destination of a ``destination = "nats"`` table (``wiring.build_broker_destination``)."""
    broker = table.broker
    assert broker is not None and broker.kind == "nats"
    return NatsJetStreamDestination(
        broker.url,
        name=broker.shown or None,
        token=broker.token,
        topic_prefix=broker.topic_prefix,
        timeout_s=table.timeout_s,
        max_in_flight=table.requests_in_flight,
        client_name=f"outbox-pipelines {table.name}",
    )
