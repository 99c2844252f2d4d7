"""NATS JetStream destination: each message published to a stream, ``sent`` only on the stream's PubAck.

Subject: the message's topic with the table's ``topic_prefix`` in front, as written (``topic_prefix =
"prod."`` and topic ``order.created`` give ``prod.order.created``; the prefix carries its own dot).

Headers: ``Nats-Msg-Id`` and ``Idempotency-Key`` (both the event_id), ``X-Outbox-Topic`` (the topic without
the prefix), the trace context (``traceparent``, ``X-Trace-Id``) and ``X-Tenant-Id`` when the message has
them; the payload is the message's JSON, compact UTF-8.

Duplicates: ``Nats-Msg-Id`` is JetStream's deduplication key. A stream drops a second message with an id
it stored within its ``duplicate_window`` (2 minutes unless the stream says otherwise) and answers a
PubAck with ``duplicate=True`` naming the first copy: that is *sent* (the message is in the stream, once).
A retry after the window stores a second copy: consumers that must act once keep deduplicating by the key.

Order: one connection, messages published in batch order; a stream stores them in publish order, and
a retried message lands after the ones published since. A table's ordering keys are kept by the relay
(one message of a key in flight at a time), not by this module.

Connection (nats-py, on a private event loop: ``LoopThread``): one connection kept open across batches,
opened at the first delivery, with ``allow_reconnect=False``. nats-py's own reconnection would retry in
the background for minutes and buffer publishes made meanwhile (its pending buffer), flushing them once
it reconnects; here a lost connection is closed at once, the publishes waiting on it end as
``retry NETWORK_TIMEOUT`` (never sent: a message counts as sent on its PubAck only), and the next batch
opens a new connection. So a broker that is down answers every delivery within about the table's
``timeout`` and the table's circuit opens (no attempt spent, nothing dead-lettered). A batch whose
acknowledgements stop coming (a peer gone without closing the socket) stops sending the rest of the
batch, answers retry, and drops the connection.

Acknowledgements: each publish carries a reply subject under one inbox subscription of the connection,
and the PubAck (or JetStream's error) is read from the reply here. nats-py's ``publish_async`` does the
same but, as of nats-py 2.16, loses every JetStream error reply (its handler raises instead of failing
the future), which would turn "stream full" or "message too large" into timeouts; ``js.publish`` maps them
but costs a task and a timer per message. At most the table's ``concurrency`` messages await their acks;
once that many do, publishing resumes when half have been answered (``_Window``).

Outcomes (each outcome's text has the connection's credentials scrubbed):
- PubAck (``duplicate`` or not) -> sent, ref ``stream:seq``;
- no stream takes the subject (no responders, and JetStream's own API confirms no stream's subjects
  match) -> dead NO_SUBSCRIBERS: replayable once a stream takes the subject. No responders while a stream
  does take the subject, or while JetStream's API does not answer either (a server shutting down answers
  publishes with no responders before it closes the connection) -> retry BROKER_5XX;
- a message larger than the server's ``max_payload`` (payload and headers), an invalid subject (empty,
  an empty token, whitespace, a wildcard ``*`` / ``>``, a ``$`` system prefix, longer than
  MAX_SUBJECT_BYTES), a stream's ``max_msg_size`` exceeded -> dead BAD_REQUEST, refused before sending
  where the client can tell (the server would otherwise close the connection, failing every message in
  flight, or store a wildcard subject no consumer's filter expects);
- authorization violation at connect, a publish or reply-inbox permission violation -> retry UNAUTHORIZED;
- connection refused / closed / lost, no PubAck within the timeout -> retry NETWORK_TIMEOUT;
- any other JetStream error (stream full with ``discard: new``, store failure, JetStream unavailable,
  mostly code 503) -> retry BROKER_5XX; an answer that is not JetStream's -> retry UNKNOWN.
"""

import asyncio
import itertools
import json
import logging
import re
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.loop_thread import LoopThread
from outbox_pipelines.core.destinations.trace_context import trace_headers
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import Scrubber, redact_text, redact_url, split_credentials, url_origin

if TYPE_CHECKING:  # the settings type, for build()'s annotation only
    from outbox_pipelines.core.settings import TableSettings

log = logging.getLogger("outbox_pipelines.destinations.nats")

# The longest subject sent: a server reads a publish's control line (subject, reply inbox, sizes) up to
# max_control_line (4 KiB by default) and closes the connection past it, for every message in flight.
MAX_SUBJECT_BYTES = 2048
# JetStream error codes that are the message's own problem (the same message is refused again):
# 10054 "message size exceeds maximum allowed" (the stream's max_msg_size).
MESSAGE_ERROR_CODES = frozenset({10054})
# Whitespace and control characters: a subject is one protocol token.
_NOT_IN_SUBJECT = re.compile(r"[\s\x00-\x1f\x7f]")
# nats-py reports a refused publish or subscription through its error callback only (the server keeps the
# connection open and sends no ack): 'nats: permissions violation for publish to "orders.created"'.
_PERMISSION = re.compile(r"permissions violation for (publish|subscription) to \"(.*)\"", re.IGNORECASE)
# The headers' fixed bytes on the wire: "NATS/1.0\r\n" ... "\r\n".
_HEADER_FRAME = len(b"NATS/1.0\r\n\r\n")
# How often a batch waiting for acks checks that its connection is still open.
CLOSED_CHECK_S = 0.2
# Subjects remembered (topic -> subject or problem); topics repeat, so this is small in practice.
_SUBJECT_CACHE_MAX = 10_000
# A reply's result when nothing listens on the subject (status 503): resolved against JetStream's API.
_NO_RESPONDERS = Outcome.retry(m.BROKER_5XX, "no responders")

Prepared = tuple[str, bytes, dict[str, str]]


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` cannot be published to (None if it can): checked before sending, because a server
    either closes the connection over it or stores it where no consumer's filter expects it."""
    if not subject:
        return "the subject is empty"
    if len(subject.encode("utf-8", "surrogatepass")) > MAX_SUBJECT_BYTES:
        return f"the subject is longer than {MAX_SUBJECT_BYTES} bytes"
    if _NOT_IN_SUBJECT.search(subject):
        return f"the subject {subject[:200]!r} holds whitespace or a control character"
    if "*" in subject or ">" in subject:
        return f"the subject {subject[:200]!r} holds a wildcard ('*' or '>'); a message is published to one subject"
    if "" in subject.split("."):
        return f"the subject {subject[:200]!r} has an empty token (a leading, trailing or doubled '.')"
    if subject.startswith("$"):
        return f"the subject {subject[:200]!r} starts with '$', the server's own namespace ($JS, $SYS, $KV ...)"
    return None


def _json(payload: Any) -> bytes:
    """The payload as compact UTF-8 JSON: orjson (a fifth of json.dumps's time), json.dumps for what orjson
    declines (integers past 64 bits, keys that are not strings); both write the same JSON values."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _header_bytes(headers: dict[str, str]) -> int:
    """The size of the headers as nats-py writes them ("Key: value\\r\\n" each, in the frame)."""
    return _HEADER_FRAME + sum(len(k) + len(v.encode()) + 4 for k, v in headers.items())


def _too_large(payload: bytes, headers: dict[str, str], max_payload: int) -> int | None:
    """The message's size on the wire if it is more than ``max_payload``, else None. Counted exactly only
    when an upper bound (4 UTF-8 bytes a character) does not settle it: the bound costs two C-level sums."""
    bound = len(payload) + _HEADER_FRAME + 4 * (len(headers) + sum(map(len, headers)) + sum(map(len, headers.values())))
    if bound <= max_payload:
        return None
    size = len(payload) + _header_bytes(headers)
    return size if size > max_payload else None


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


class _ConnectFailed(Exception):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


@dataclass
class _Sent:
    """One published message awaiting its PubAck (the future's result is its outcome)."""

    index: int
    subject: str
    token: str
    future: "asyncio.Future[Outcome]"
    deadline: float


@dataclass(eq=False)  # hashed by identity: a connection keeps its batches in flight in a set
class _Batch:
    """One delivery's published messages, what the ack watchdog has checked, and whether it stalled."""

    sent: list[_Sent] = field(default_factory=list)
    watched: int = 0
    timer: asyncio.TimerHandle | None = None
    stalled: bool = False


@dataclass(eq=False)
class _Connection:
    """One open connection: its client, the reply inbox its acks come back on, what waits on them."""

    nc: Client
    inbox: str  # "_INBOX.<nuid>." : a publish's reply subject is this and a token
    waiting: dict[str, "asyncio.Future[Outcome]"] = field(default_factory=dict)
    batches: set[_Batch] = field(default_factory=set)
    tokens: "itertools.count[int]" = field(default_factory=itertools.count)
    # Why the server will not let this connection read its acks (a subscription permission violation).
    denied: str | None = None

    def settle(self, item: _Sent, outcome: Outcome) -> None:
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


class NatsJetStreamDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True

    def __init__(self, url: str, *, name: str | None = None, token: str | None = None, topic_prefix: str = "",
                 timeout_s: float = 5.0, max_in_flight: int = 32, client_name: str = "outbox-pipelines") -> None:
        shown = redact_url(url)
        if not url.startswith(("nats://", "tls://")):
            raise ConfigError(f"a NATS URL starts with nats:// or tls://, got {shown!r}")
        try:
            server, credentials = split_credentials(url)
        except ValueError as exc:
            raise ConfigError(f"NATS URL {shown!r} is not a valid URL: {redact_text(str(exc))}") from None
        if credentials is not None and token:
            raise ConfigError(f"NATS {url_origin(server)}: the URL carries user:password and a token (token_env) is "
                              "set too; a connection authenticates one way: keep one")
        # Credentials go to nats-py as options, never inside the server URL it keeps, logs and reports.
        self._server, self._credentials, self._token = server, credentials, token
        self.name = redact_text(name) if name else url_origin(server)
        self.scrub = Scrubber(url, token=token, credentials=credentials)
        self.topic_prefix = topic_prefix
        self.timeout_s = timeout_s
        self.max_in_flight = max(1, max_in_flight)
        self.client_name = client_name
        self._subjects: dict[str, tuple[str, str | None]] = {}
        self._conn: _Connection | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._loop = LoopThread("outbox-nats")
        self._loop.loop.set_exception_handler(self._loop_exception)
        self._connecting = asyncio.Lock()  # bound to the private loop at first use
        self._no_ack = Outcome.retry(m.NETWORK_TIMEOUT, f"no PubAck from NATS {self.name} within {timeout_s:g} s")
        self._closed = Outcome.retry(m.NETWORK_TIMEOUT, f"connection to NATS {self.name} closed before the PubAck")

    # -- what goes on the wire -------------------------------------------------

    def _subject(self, topic: str) -> tuple[str, str | None]:
        known = self._subjects.get(topic)
        if known is None:
            subject = self.topic_prefix + topic
            known = (subject, subject_problem(subject))
            if len(self._subjects) >= _SUBJECT_CACHE_MAX:
                self._subjects.clear()
            self._subjects[topic] = known
        return known

    def _prepare(self, message: ClaimedMessage) -> Prepared | Outcome:
        """(subject, payload, headers), or the dead outcome of a message no server would take."""
        subject, problem = self._subject(message.topic)
        if problem is not None:
            return Outcome.dead(m.BAD_REQUEST, f"not published: {problem}")
        try:
            payload = _json(message.payload)
        except (TypeError, ValueError) as exc:
            return Outcome.dead(m.BAD_REQUEST, f"not published: the payload is not JSON: {exc}")
        event_id = message.event_id
        # What a consumer needs, no more: nats-py encodes each header in Python (about 2.5 µs apiece, as much
        # as the rest of a publish), so no Content-Type (the payload is always JSON) and no attempt number.
        headers = {"Nats-Msg-Id": event_id, "Idempotency-Key": event_id, "X-Outbox-Topic": message.topic}
        if message.headers:
            headers.update(trace_headers(message))
            trace_id = message.trace_id
            if trace_id:
                headers["X-Trace-Id"] = trace_id
        if message.tenant_id:
            headers["X-Tenant-Id"] = message.tenant_id
        return subject, payload, headers

    # -- the connection --------------------------------------------------------

    async def _connection(self) -> _Connection:
        """The open connection, or a new one (``_ConnectFailed`` with the outcome for every message)."""
        async with self._connecting:
            if self._conn is not None and self._conn.nc.is_connected and self._conn.denied is None:
                return self._conn
            self._drop()
            errors: list[Exception] = []
            nc = Client()
            conn = _Connection(nc, nc.new_inbox() + ".")

            async def error_cb(exc: Exception) -> None:
                errors.append(exc)
                self._on_error(conn, exc)

            async def closed_cb() -> None:
                conn.fail(self._closed)  # what waits on a closed connection retries now, not at its timeout

            options: dict[str, Any] = {
                "servers": [self._server], "name": self.client_name, "error_cb": error_cb, "closed_cb": closed_cb,
                "allow_reconnect": False, "connect_timeout": self.timeout_s,
                # With allow_reconnect=False nats-py still tries a refused server again inside connect();
                # one more try, soon: the table's retry policy and circuit do the waiting, not this call.
                "max_reconnect_attempts": 1, "reconnect_time_wait": 0.05,
                # No pending buffer: nothing is buffered while not connected (a publish then fails at once),
                # and no publish waits on a "forced flush", which nats-py 2.16 leaves waiting forever when
                # the connection closes meanwhile. The buffer stays bounded anyway: at most max_in_flight
                # messages are written before this loop waits for their acks, and the flusher drains it.
                "pending_size": 0,
            }
            if self._credentials is not None:
                options["user"], options["password"] = self._credentials
            if self._token:
                options["token"] = self._token
            try:
                await asyncio.wait_for(self._open(conn, options), self.timeout_s + 1)
            except Exception as exc:  # noqa: BLE001 - every failure to connect is an outcome
                await self._discard(nc)
                raise _ConnectFailed(self._connect_outcome(exc, errors)) from None
            if conn.denied is not None:
                await self._discard(nc)
                raise _ConnectFailed(Outcome.retry(m.UNAUTHORIZED, self.scrub(conn.denied)))
            self._conn = conn
            return conn

    async def _open(self, conn: _Connection, options: dict[str, Any]) -> None:
        await conn.nc.connect(**options)

        async def on_reply(msg: Msg) -> None:
            self._on_reply(conn, msg)

        await conn.nc.subscribe(conn.inbox + "*", cb=on_reply)
        await conn.nc.flush(timeout=max(1, int(self.timeout_s)))  # a refused subscription is reported by now

    def _connect_outcome(self, exc: Exception, errors: list[Exception]) -> Outcome:
        # "no servers available" says less than the error that used the last try up (refused, reset ...).
        cause = errors[-1] if isinstance(exc, nats.errors.NoServersError) and errors else exc
        text = f"{type(cause).__name__}: {cause}".strip()
        where = url_origin(self._server)
        if isinstance(cause, nats.errors.AuthorizationError) or "authoriz" in text.lower() \
                or "authentication" in text.lower():
            return Outcome.retry(m.UNAUTHORIZED, self.scrub(f"NATS {where} refused the credentials: {text}"))
        if isinstance(cause, (asyncio.TimeoutError, TimeoutError)):
            text = f"no answer within {self.timeout_s:g} s"
        return Outcome.retry(m.NETWORK_TIMEOUT, self.scrub(f"cannot connect to NATS {where}: {text}"))

    def _on_error(self, conn: _Connection, exc: Exception) -> None:
        """nats-py's asynchronous errors: a permissions violation fails the publishes it concerns now
        (the server sends no ack for them); the rest show in the outcomes of the publishes they break."""
        match = _PERMISSION.search(str(exc))
        if match is None:
            log.debug("NATS %s: %s", self.name, self.scrub(f"{type(exc).__name__}: {exc}"))
            return
        kind, subject = match.groups()
        if kind.lower() == "publish":
            conn.fail(Outcome.retry(m.UNAUTHORIZED, self.scrub(
                f"NATS {self.name} denied these credentials publishing to {subject!r}")), subject)
            return
        conn.denied = (f"NATS {self.name} denied these credentials subscribing to {subject!r}, where the PubAcks "
                       "come back: allow them to subscribe to _INBOX.>")
        conn.fail(Outcome.retry(m.UNAUTHORIZED, self.scrub(conn.denied)))

    def _on_reply(self, conn: _Connection, msg: Msg) -> None:
        """A reply on the inbox: the PubAck, JetStream's error, or no responders; ends that message's wait."""
        future = conn.waiting.pop(msg.subject[len(conn.inbox):], None)
        if future is None or future.done():
            return  # a late ack for a message already answered (timed out, connection failed)
        if not msg.data and msg.headers and msg.headers.get("Status") == "503":
            future.set_result(_NO_RESPONDERS)
            return
        try:
            answer = orjson.loads(msg.data)
            error = answer.get("error")
            if error is None:
                # A PubAck with "duplicate": true is sent too: the stream already holds this event_id (an
                # earlier attempt whose ack was lost) and stored nothing new; the ref names the copy it holds.
                future.set_result(Outcome.sent(ref=f"{answer['stream']}:{answer['seq']}"))
            else:
                future.set_result(self._api_error_outcome(error))
        except (ValueError, TypeError, KeyError, AttributeError):
            future.set_result(Outcome.retry(m.UNKNOWN, self.scrub(
                f"NATS {self.name} answered the publish with something that is not a PubAck: {msg.data[:200]!r}")))

    def _api_error_outcome(self, error: dict[str, Any]) -> Outcome:
        what = self.scrub(f"JetStream on NATS {self.name} refused the message: {error.get('description')} "
                          f"(code {error.get('code')}, err_code {error.get('err_code')})")
        if error.get("err_code") in MESSAGE_ERROR_CODES:
            return Outcome.dead(m.BAD_REQUEST, what)
        # Stream full (discard: new), store failure, JetStream unavailable ...: the broker's state, not the
        # message's; retried, and a table where every message fails this way opens its circuit.
        return Outcome.retry(m.BROKER_5XX, what)

    def _drop(self) -> None:
        """Forget the connection (closed in the background, bounded); the next batch opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.nc.is_closed:
            task = asyncio.get_running_loop().create_task(self._discard(conn.nc))
            self._closing.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _discard(nc: Client) -> None:
        try:
            await asyncio.wait_for(nc.close(), 2.0)
        except Exception:  # noqa: BLE001 - a connection being discarded may fail to close; nothing to do
            pass

    # -- one delivery ----------------------------------------------------------

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not messages:
            return []
        future = asyncio.run_coroutine_threadsafe(self._deliver(messages), self._loop.loop)
        backstop = 3 * self.timeout_s + 10
        try:
            # Bounded by the connect and ack timeouts inside; this is only a backstop for a stuck loop.
            return future.result(timeout=backstop)
        except FutureTimeout:
            future.cancel()
            return [Outcome.retry(m.NETWORK_TIMEOUT, f"no answer from NATS {self.name} in {backstop:g} s")] * len(
                messages)

    async def _deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(messages)
        prepared = [self._prepare(message) for message in messages]
        try:
            conn = await self._connection()
        except _ConnectFailed as failed:
            return [item if isinstance(item, Outcome) else failed.outcome for item in prepared]
        batch = _Batch()
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
        if batch.stalled and self._conn is conn:
            self._drop()  # acks stopped coming on a connection that looks open: do not trust it
        return [o if o is not None else Outcome.retry(m.UNKNOWN, "no outcome") for o in outcomes]

    async def _publish(self, conn: _Connection, batch: _Batch, prepared: list[Prepared | Outcome],
                       outcomes: list[Outcome | None]) -> None:
        """Publish each message, at most ``max_in_flight`` awaiting their acks; stop sending (retry the
        rest, unsent) once the connection fails or an ack is overdue."""
        loop = asyncio.get_running_loop()
        window = _Window(self.max_in_flight)
        stopped: Outcome | None = None
        nc, inbox, waiting, tokens = conn.nc, conn.inbox, conn.waiting, conn.tokens
        max_payload, timeout = nc.max_payload, self.timeout_s

        for index, item in enumerate(prepared):
            if isinstance(item, Outcome):
                outcomes[index] = item
                continue
            if stopped is None and (batch.stalled or conn.denied is not None):
                stopped = Outcome.retry(m.UNAUTHORIZED, self.scrub(conn.denied)) if conn.denied else replace(
                    self._no_ack, error=f"not sent: {self._no_ack.error} for a message before it")
            if stopped is not None:
                outcomes[index] = stopped
                continue
            subject, payload, headers = item
            size = _too_large(payload, headers, max_payload)
            if size is not None:
                outcomes[index] = Outcome.dead(m.BAD_REQUEST, f"not published: {size:,} bytes with headers, more "
                                               f"than the server's max_payload ({max_payload:,} bytes)")
                continue
            if window.full:
                await window.room()  # the ack watchdog ends the oldest wait by its deadline at the latest
            token = str(next(tokens))
            future: asyncio.Future[Outcome] = loop.create_future()
            waiting[token] = future
            try:
                await nc.publish(subject, payload, reply=inbox + token, headers=headers)
            except Exception as exc:  # noqa: BLE001 - a refused publish is this message's outcome
                waiting.pop(token, None)
                outcome = outcomes[index] = self._exception_outcome(exc)
                if outcome.code == m.NETWORK_TIMEOUT:
                    stopped = replace(outcome, error=f"not sent: {outcome.error}")
                    if nc.is_closed:
                        conn.fail(self._closed)  # what waits on it now, not at the next check
                continue
            window.add(future)
            batch.sent.append(_Sent(index, subject, token, future, loop.time() + timeout))
            if batch.timer is None:
                self._watch(conn, batch)

    def _watch(self, conn: _Connection, batch: _Batch) -> None:
        """The ack watchdog: ends each message's wait once its PubAck is overdue (deadlines grow in publish
        order, so one timer, set for the oldest message still waiting, serves the whole batch), and every
        wait at once when the connection is closed (nats-py does not always call closed_cb: its close
        stops at a broken pipe while flushing)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        batch.timer = None
        if conn.nc.is_closed:
            conn.fail(self._closed)
        while batch.watched < len(batch.sent):
            item = batch.sent[batch.watched]
            if not item.future.done():
                if item.deadline > now:
                    batch.timer = loop.call_at(min(item.deadline, now + CLOSED_CHECK_S), self._watch, conn, batch)
                    return
                conn.settle(item, self._no_ack)
                batch.stalled = True
            batch.watched += 1

    async def _collect(self, conn: _Connection, batch: _Batch, outcomes: list[Outcome | None]) -> None:
        """Each published message's outcome, once its ack (or failure) is in."""
        unrouted: dict[str, list[int]] = {}
        for item in batch.sent:
            outcome = await item.future  # always ends: an ack, the watchdog, or the connection's close
            if outcome is _NO_RESPONDERS:
                unrouted.setdefault(item.subject, []).append(item.index)
            else:
                outcomes[item.index] = outcome
        for subject, indexes in unrouted.items():
            outcome = await self._no_responders(conn, subject)
            for index in indexes:
                outcomes[index] = outcome

    async def _no_responders(self, conn: _Connection, subject: str) -> Outcome:
        """No responders to a publish: no stream takes the subject (dead), or JetStream is not answering
        (a server shutting down answers so before it closes the connection): asked of JetStream's API."""
        try:
            stream = await conn.nc.jsm(timeout=self.timeout_s).find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            return Outcome.dead(m.NO_SUBSCRIBERS, f"no JetStream stream on NATS {self.name} takes subject "
                                f"{subject!r}: add the subject to a stream, then replay the message")
        except nats.js.errors.ServiceUnavailableError:
            return Outcome.retry(m.BROKER_5XX, f"JetStream on NATS {self.name} is not answering (no responders "
                                 "to a publish or to its API: shutting down, or not enabled for this account)")
        except Exception as exc:  # noqa: BLE001 - the check itself failed (connection lost ...)
            return self._exception_outcome(exc)
        return Outcome.retry(m.BROKER_5XX, f"stream {stream!r} on NATS {self.name} takes subject {subject!r} "
                             "but did not answer the publish (restarting, or no leader)")

    def _exception_outcome(self, exc: BaseException) -> Outcome:
        """The outcome of a publish the client refused or could not make."""
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, (nats.errors.BadSubjectError, nats.errors.MaxPayloadError, nats.errors.BadHeaderError)):
            outcome = Outcome.dead(m.BAD_REQUEST, f"the NATS client refused to publish the message: {text}")
        elif isinstance(exc, nats.js.errors.APIError):
            outcome = self._api_error_outcome({"description": exc.description, "code": exc.code,
                                               "err_code": exc.err_code})
        elif isinstance(exc, (nats.errors.ConnectionClosedError, nats.errors.OutboundBufferLimitError,
                              nats.errors.ConnectionDrainingError, nats.errors.ConnectionReconnectingError,
                              nats.errors.StaleConnectionError, asyncio.TimeoutError, TimeoutError, OSError)):
            outcome = Outcome.retry(m.NETWORK_TIMEOUT, f"connection to NATS {self.name} lost: {text}")
        else:
            outcome = Outcome.retry(m.UNKNOWN, f"NATS {self.name}: {text}")
        return replace(outcome, error=self.scrub(outcome.error))

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """nats-py's background tasks of a connection lost abruptly end with errors nobody awaits (a read
        loop's BrokenPipeError): the outcomes say what failed, so these are debug lines, scrubbed."""
        exc = context.get("exception")
        text = f"{type(exc).__name__}: {exc}" if exc is not None else str(context.get("message"))
        log.debug("NATS %s client: %s", self.name, self.scrub(text))

    def close(self) -> None:
        async def closing() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._discard(conn.nc)
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
        broker.url, name=broker.shown or None, token=broker.token, topic_prefix=broker.topic_prefix,
        timeout_s=table.timeout_s, max_in_flight=table.requests_in_flight,
        client_name=f"outbox-pipelines {table.name}",
    )
