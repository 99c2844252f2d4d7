"""The NATS destination's connection: opening it, the reply inbox its PubAcks come back on, what waits on
them, the server's asynchronous complaints, and dropping it.

One connection kept across batches, never reconnecting by itself: a lost one fails what waits on it (retry) and
the next batch opens another. Credentials go to nats-py as options, never in the URL.
Why: docs/explanation/transports.md, "NATS: the connection".
"""

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from outbox_pipelines.core.destinations.nats.outcomes import NatsOutcomes, permission_violation
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.redaction import url_origin

log = logging.getLogger("outbox_pipelines.destinations.nats")


class ConnectFailed(Exception):
    """No connection: ``outcome`` is every message's of the batch."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


@dataclass
class Sent:
    """One published message awaiting its PubAck (the future's result is its outcome)."""

    index: int
    subject: str
    token: str
    future: "asyncio.Future[Outcome]"
    deadline: float


@dataclass(eq=False)  # hashed by identity: a connection keeps its batches in flight in a set
class Batch:
    """One delivery's published messages, what the ack watchdog has checked, and whether it stalled."""

    sent: list[Sent] = field(default_factory=list)
    watched: int = 0
    timer: asyncio.TimerHandle | None = None
    stalled: bool = False


@dataclass(eq=False)
class Connection:
    """One open connection: its client, the reply inbox its acks come back on, what waits on them."""

    nc: Client
    inbox: str  # "_INBOX.<nuid>." : a publish's reply subject is this and a token
    waiting: dict[str, "asyncio.Future[Outcome]"] = field(default_factory=dict)
    batches: set[Batch] = field(default_factory=set)
    tokens: "itertools.count[int]" = field(default_factory=itertools.count)
    # Why the server will not let this connection read its acks (a subscription permission violation).
    denied: str | None = None

    def settle(self, item: Sent, outcome: Outcome) -> None:
        """End one message's wait with ``outcome`` (a late ack for it is then ignored)."""
        self.waiting.pop(item.token, None)
        if not item.future.done():
            item.future.set_result(outcome)

    def fail(self, outcome: Outcome, subject: str | None = None) -> None:
        """End the wait of every message in flight on this connection (published to ``subject``, if given)."""
        for batch in self.batches:
            for item in batch.sent:
                if not item.future.done() and (subject is None or item.subject == subject):
                    self.settle(item, outcome)


class Connector:
    """The one connection of a destination, opened when a batch needs it and dropped when it fails.
    Used on the destination's event loop only."""

    def __init__(
        self,
        server: str,
        *,
        credentials: tuple[str, str] | None,
        token: str | None,
        client_name: str,
        timeout_s: float,
        outcomes: NatsOutcomes,
    ) -> None:
        self._server, self._credentials, self._token = server, credentials, token
        self.client_name = client_name
        self.timeout_s = timeout_s
        self.outcomes = outcomes
        self._conn: Connection | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._connecting = asyncio.Lock()  # bound to the private loop at first use

    async def connection(self) -> Connection:
        """The open connection, or a new one (``ConnectFailed`` with the outcome for every message)."""
        async with self._connecting:
            if self._conn is not None and self._conn.nc.is_connected and self._conn.denied is None:
                return self._conn
            self.drop()
            errors: list[Exception] = []
            nc = Client()
            conn = Connection(nc, nc.new_inbox() + ".")

            async def error_cb(exc: Exception) -> None:
                errors.append(exc)
                self._on_error(conn, exc)

            async def closed_cb() -> None:
                conn.fail(self.outcomes.closed)  # what waits on a closed connection retries now, not at its timeout

            try:
                await asyncio.wait_for(self._open(conn, self._options(error_cb, closed_cb)), self.timeout_s + 1)
            except Exception as exc:  # every failure to connect is an outcome
                await self.discard(nc)
                raise ConnectFailed(self.outcomes.connect_failed(exc, errors, url_origin(self._server))) from None
            if conn.denied is not None:
                await self.discard(nc)
                raise ConnectFailed(self.outcomes.denied(conn.denied))
            self._conn = conn
            return conn

    def _options(self, error_cb: Any, closed_cb: Any) -> dict[str, Any]:
        options: dict[str, Any] = {
            "servers": [self._server],
            "name": self.client_name,
            "error_cb": error_cb,
            "closed_cb": closed_cb,
            "allow_reconnect": False,
            "connect_timeout": self.timeout_s,
            # With allow_reconnect=False nats-py still tries a refused server again inside connect();
            # one more try, soon: the table's retry policy and circuit do the waiting, not this call.
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0.05,
            # No pending buffer: nothing is buffered while not connected (a publish then fails at once),
            # and no publish waits on a "forced flush", which nats-py 2.16 leaves waiting forever when
            # the connection closes meanwhile. The buffer stays bounded anyway: at most max_in_flight
            # messages are written before the destination waits for their acks, and the flusher drains it.
            "pending_size": 0,
        }
        if self._credentials is not None:
            options["user"], options["password"] = self._credentials
        if self._token:
            options["token"] = self._token
        return options

    async def _open(self, conn: Connection, options: dict[str, Any]) -> None:
        await conn.nc.connect(**options)

        async def on_reply(msg: Msg) -> None:
            self._on_reply(conn, msg)

        await conn.nc.subscribe(conn.inbox + "*", cb=on_reply)
        await conn.nc.flush(timeout=max(1, int(self.timeout_s)))  # a refused subscription is reported by now

    def _on_error(self, conn: Connection, exc: Exception) -> None:
        """nats-py's asynchronous errors: a permissions violation fails the publishes it concerns now
        (the server sends no ack for them); the rest show in the outcomes of the publishes they break."""
        violation = permission_violation(exc)
        if violation is None:
            log.debug("NATS %s: %s", self.outcomes.name, self.outcomes.scrub(f"{type(exc).__name__}: {exc}"))
            return
        kind, subject = violation
        name = self.outcomes.name
        if kind == "publish":
            conn.fail(self.outcomes.denied(f"NATS {name} denied these credentials publishing to {subject!r}"), subject)
            return
        conn.denied = (
            f"NATS {name} denied these credentials subscribing to {subject!r}, where the PubAcks "
            "come back: allow them to subscribe to _INBOX.>"
        )
        conn.fail(self.outcomes.denied(conn.denied))

    def _on_reply(self, conn: Connection, msg: Msg) -> None:
        """A reply on the inbox ends its message's wait with the outcome it says."""
        future = conn.waiting.pop(msg.subject[len(conn.inbox) :], None)
        if future is None or future.done():
            return  # a late ack for a message already answered (timed out, connection failed)
        future.set_result(self.outcomes.reply(msg))

    def drop(self, conn: Connection | None = None) -> None:
        """Forget the connection (``conn`` only: if it is still the one in use), closed in the background,
        bounded; the next batch opens a new one."""
        if conn is not None and conn is not self._conn:
            return
        conn, self._conn = self._conn, None
        if conn is not None and not conn.nc.is_closed:
            task = asyncio.get_running_loop().create_task(self.discard(conn.nc))
            self._closing.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self.discard(conn.nc)

    @staticmethod
    async def discard(nc: Client) -> None:
        try:
            await asyncio.wait_for(nc.close(), 2.0)
        except Exception:  # a connection being discarded may fail to close; nothing to do
            pass
