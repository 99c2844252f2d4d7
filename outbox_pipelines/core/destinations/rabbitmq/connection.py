"""The RabbitMQ destination's connection and its confirm-mode channel: opened (and the exchange declared)
when a batch needs them, dropped when they fail.

One connection and one channel kept across batches; a lost one (or a timeout) is dropped, the rest of its batch
not attempted, and the next batch opens another (docs/explanation/transports.md, "RabbitMQ").
"""

import asyncio
import logging

import aiormq
import aiormq.abc

from outbox_pipelines.core.destinations.rabbitmq.outcomes import connect_outcome
from outbox_pipelines.core.models import Outcome

log = logging.getLogger("outbox_pipelines.destinations.rabbitmq")


class Ended(Exception):
    """The round's channel or connection is gone: every publish without an outcome ends as ``outcome``."""

    def __init__(self, outcome: Outcome, drop_connection: bool) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome
        self.drop_connection = drop_connection


class ChannelKeeper:
    """The open channel to ``exchange`` on the broker at ``url``, on the destination's event loop."""

    def __init__(self, url: str, exchange: str, timeout_s: float) -> None:
        self.url = url
        self.exchange = exchange
        self.timeout_s = timeout_s
        self._connection: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.Channel | None = None
        # When (the loop's clock) a connection replaced one this keeper had before (lost, timed out, or
        # dropped after a refusal): the broker may have restarted, and still be restoring its queues'
        # bindings (``reconnected_s``).
        self._had_connection = False
        self._reconnected_at: float | None = None

    def _connection_lost(self) -> bool:
        return self._connection is None or self._connection.is_closed

    async def ready(self) -> aiormq.Channel:
        """The open confirm channel, connecting and declaring the exchange first if needed; Ended if not."""
        if self._channel is not None and not self._channel.is_closed and not self._connection_lost():
            return self._channel
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._connection_lost():
                    await self.drop()
                    self._connection = await aiormq.connect(
                        self.url, client_properties={"connection_name": f"outbox-pipelines {self.exchange}"}
                    )
                    loop = asyncio.get_running_loop()
                    self._reconnected_at = loop.time() if self._had_connection else None
                    self._had_connection = True
                assert self._connection is not None
                channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
                assert isinstance(channel, aiormq.Channel)  # the concrete class: its basic_publish takes wait=
                await channel.exchange_declare(self.exchange, exchange_type="topic", durable=True)
        except Exception as exc:  # an outcome for every pending message
            raise Ended(connect_outcome(exc, self.exchange, self.timeout_s), drop_connection=True) from None
        self._channel = channel
        return channel

    def reconnected_s(self) -> float | None:
        """Seconds since the open connection replaced an earlier one; None on the keeper's first connection."""
        if self._reconnected_at is None:
            return None
        return asyncio.get_running_loop().time() - self._reconnected_at

    async def drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is None or connection.is_closed:
            return
        try:
            await asyncio.wait_for(connection.close(), 1.0)
        except Exception:  # a connection that will not close politely is abandoned
            log.debug("closing the RabbitMQ connection failed", exc_info=True)
