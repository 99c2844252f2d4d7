"""Kafka destination (``destination = "kafka"``): one idempotent confluent-kafka Producer per destination.

Each message becomes one record on ``topic_prefix + message.topic``, keyed by the message's ordering key
(else its event_id), so every message of one aggregate lands in one partition, in the order the relay
sends them. Records carry ``idempotency-key`` (the event_id, the same on every attempt: a consumer
deduplicates by it), ``outbox-topic``, ``outbox-attempt``, ``content-type`` and the trace headers the HTTP
destination sends (``traceparent``, ``trace-id``, ``tenant-id``). The value is the payload as compact JSON.

Guarantees: ``enable.idempotence`` (and with it ``acks=all``): the broker writes a record once however
often the producer retries it within one producer session, in order per partition. A message is ``sent``
only when its delivery report came back without an error, and its reference is ``topic/partition@offset``.

Time: a batch is produced whole, then the delivery reports are awaited. ``message.timeout.ms`` is the
table's ``timeout``, so librdkafka itself gives up on a record it could not deliver in time and reports it
as an error (retry NETWORK_TIMEOUT) instead of keeping it queued and delivering it after the relay said
"retry" (which would send it twice). The wait ends a little after that (``REPORT_GRACE_S``: librdkafka
checks timeouts about once a second); a record still unreported then is answered retry NETWORK_TIMEOUT
and left behind, counted in ``abandoned``, and if it is delivered later after all, counted in
``late_deliveries`` (a duplicate once it is delivered again: allowed, at least once, but counted). A full
local queue (BufferError) is waited out by serving delivery reports until the batch's deadline, never by
dropping the record. So a batch never takes much longer than the table's timeout, even when no broker
answers, and the producer reconnects by itself when the cluster is back.

Outcomes (each decided here, on the error librdkafka reports, and why):

- message too large (MSG_SIZE_TOO_LARGE, the broker's or the producer's ``message.max.bytes``), an
  invalid record, or a topic name Kafka cannot hold (checked before producing: ``[A-Za-z0-9._-]``, at most
  249 characters, not ``.``/``..``) → dead BAD_REQUEST: the message itself is refused, sending it again
  cannot succeed (replay needs --force, after the message or the limit changed);
- unknown topic (UNKNOWN_TOPIC_OR_PART, ``_UNKNOWN_TOPIC``: the broker does not create topics) → dead
  NO_SUBSCRIBERS: no topic takes this message, while the cluster is fine and the table's other topics
  still deliver, so it must not open the table's circuit (which would hold every topic); once the topic
  is created, replay delivers it without --force. ``topic.metadata.propagation.max.ms`` is cut to half the
  timeout so the verdict comes within the batch (the default 30 s would first time out the message and
  count a destination failure); librdkafka asks again about a missing topic every second, so a topic
  created since is seen at once;
- authorization or authentication refused (TOPIC/CLUSTER_AUTHORIZATION_FAILED, SASL, SSL, or records that
  timed out while the client reported an authentication failure) → retry UNAUTHORIZED: a credential or ACL
  problem of the destination, fixed outside the message: the circuit opens, nothing is dead-lettered;
- timed out, brokers unreachable, transport errors → retry NETWORK_TIMEOUT; retriable broker answers
  (not enough replicas, leader moving, storage error) → retry BROKER_5XX; both open the circuit;
- a fatal idempotent-producer error (the client's ``error.fatal()``: sequence desynchronised, fenced) →
  retry UNKNOWN for what was not confirmed, and the producer is recreated before the next batch (a
  producer in the fatal state accepts nothing again). Anything unforeseen → retry UNKNOWN, never dead.

Error texts pass through the destination's ``Scrubber``: the name shows ``kafka://host:port``, never a
SASL credential given in ``config`` (extra librdkafka settings: ``security.protocol``, ``sasl.*``,
``ssl.*``; the settings that carry the guarantees above cannot be overridden). librdkafka's own log lines
go to the ``outbox_pipelines.kafka`` logger, each kind at most once every 30 s (an outage would otherwise
log every reconnect of every broker). The producer is created with the destination, so it connects and
obtains its producer id while the relay starts, and a refused setting fails the start, not a delivery.
"""

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.trace_context import valid_traceparent
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import Scrubber, redact_text

if TYPE_CHECKING:
    from outbox_pipelines.core.settings import TableSettings

log = logging.getLogger("outbox_pipelines.kafka")

# What Kafka accepts as a topic name (its Topic.validate): these characters, 1 to 249 of them, not "."/"..".
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# librdkafka checks message timeouts about once a second: a timed-out record is reported up to ~1 s late.
REPORT_GRACE_S = 1.5
_TOPIC_CACHE_SIZE = 10_000
# How long a BufferError (local queue full) waits for reports to drain before the next try.
_QUEUE_FULL_POLL_S = 0.05
# Settings that carry the destination's guarantees: ``config`` may not change them.
_GUARANTEED = ("enable.idempotence", "acks", "message.timeout.ms", "delivery.timeout.ms", "bootstrap.servers",
               "on_delivery", "error_cb", "logger")
_SECRET_SETTINGS = ("sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password", "ssl.keystore.password")

_E = KafkaError
_TOO_LARGE = frozenset({_E.MSG_SIZE_TOO_LARGE})
_INVALID_TOPIC_EXCEPTION = 17  # not among confluent-kafka's KafkaError constants
_BAD_MESSAGE = frozenset({_E.INVALID_RECORD, _E.UNSUPPORTED_FOR_MESSAGE_FORMAT, _E.POLICY_VIOLATION,
                          _INVALID_TOPIC_EXCEPTION, _E._INVALID_ARG, _E._BAD_MSG, _E._INVALID_TYPE})
_NO_TOPIC = frozenset({_E.UNKNOWN_TOPIC_OR_PART, _E._UNKNOWN_TOPIC, _E._UNKNOWN_PARTITION, _E.UNKNOWN_TOPIC_ID})
_REFUSED = frozenset({_E.TOPIC_AUTHORIZATION_FAILED, _E.CLUSTER_AUTHORIZATION_FAILED, _E._AUTHENTICATION,
                      _E.SASL_AUTHENTICATION_FAILED, _E._SSL})
_UNREACHABLE = frozenset({_E._MSG_TIMED_OUT, _E._TIMED_OUT, _E._TRANSPORT, _E._ALL_BROKERS_DOWN, _E._RESOLVE,
                          _E.NETWORK_EXCEPTION, _E._QUEUE_FULL, _E._PURGE_QUEUE, _E._PURGE_INFLIGHT})
_PRODUCER_BROKEN = frozenset({_E._FATAL, _E._FENCED, _E.OUT_OF_ORDER_SEQUENCE_NUMBER, _E.INVALID_PRODUCER_EPOCH,
                              _E.PRODUCER_FENCED, _E.UNKNOWN_PRODUCER_ID, _E._INCONSISTENT})


def topic_problem(topic: str) -> str | None:
    """Why Kafka cannot hold a topic of this name, or None."""
    if not _TOPIC.fullmatch(topic):
        if len(topic) > 249:
            return f"the Kafka topic name is {len(topic)} characters long; Kafka takes at most 249"
        return f"the Kafka topic name {topic[:100]!r} is empty or holds characters other than A-Z a-z 0-9 . _ -"
    if topic in (".", ".."):
        return f"{topic!r} is not a Kafka topic name"
    return None


_CONTENT_TYPE = ("content-type", "application/json")
# One encoder for every payload: json.dumps with non-default options builds a new one per call (2 µs).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def record_headers(message: ClaimedMessage) -> list[tuple[str, str | bytes | None]]:
    """The record's headers: the idempotency key first, then what the HTTP destination sends (the outbox
    topic, the attempt, a well-formed traceparent, the trace and tenant ids)."""
    headers: list[tuple[str, str | bytes | None]] = [
        ("idempotency-key", message.event_id), ("outbox-topic", message.topic),
        ("outbox-attempt", str(message.attempts)), _CONTENT_TYPE]
    extra = message.headers
    if extra and isinstance(extra, dict):
        traceparent = valid_traceparent(extra.get("traceparent"))
        if traceparent:
            headers.append(("traceparent", traceparent))
        trace_id = extra.get("trace_id")
        if trace_id is not None:
            headers.append(("trace-id", str(trace_id)))
    if message.tenant_id:
        headers.append(("tenant-id", message.tenant_id))
    return headers


def _sent(ref: str) -> Outcome:
    """Outcome.sent(ref=ref) without the frozen dataclass's __init__ (five object.__setattr__ calls: a
    tenth of a record's cost here), as models.EnqueueResult.new does."""
    outcome = object.__new__(Outcome)
    outcome.__dict__.update(kind="sent", code=None, error=None, ref=ref, delay_s=None)
    return outcome


# The same client complaint (a broker refusing connections during an outage) is logged once this often.
LOG_EVERY_S = 30.0


class _ClientLog:
    """librdkafka's own log lines into ``outbox_pipelines.kafka``, each kind (level, facility, broker) at
    most once every LOG_EVERY_S: during an outage librdkafka reports every reconnect of every broker,
    several lines a second, while the table's circuit already says the destination is down."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, str, str], tuple[float, int]] = {}

    def log(self, level: int, _format: str, facility: str, _client: str, text: str) -> None:
        # confluent-kafka calls logger.log(level, "%s [%s] %s", facility, client name, text) while it serves
        # the producer's queue; an exception here would be raised by that poll, so none may escape.
        try:
            key = (level, facility, text.split(": ", 1)[0])
            now = time.monotonic()
            last, skipped = self._last.get(key, (-LOG_EVERY_S, 0))
            if now - last < LOG_EVERY_S:
                self._last[key] = (last, skipped + 1)
                return
            if len(self._last) > 1_000:
                self._last.clear()
            self._last[key] = (now, 0)
            more = f" ({skipped} more like it in the last {now - last:.0f} s)" if skipped else ""
            log.log(level, "librdkafka %s: %s%s", facility, text, more)
        except Exception:  # noqa: BLE001, S110 - logging must never fail a delivery
            pass


class _Batch:
    """One deliver() call's records: their delivery reports as they come back (on whichever thread polls)."""

    __slots__ = ("reports", "pending", "answered", "destination")

    def __init__(self, size: int, destination: "KafkaDestination") -> None:
        self.reports: list[tuple[KafkaError | None, Message] | None] = [None] * size
        self.pending = 0
        self.answered = False  # deliver() returned: a report now comes too late for this batch
        self.destination = destination

    def reporter(self, index: int) -> Any:
        # The callback only stores what it got: confluent-kafka may call it with a Python exception pending
        # (a fatal error raised while reports are served), when most calls would fail.
        def report(err: KafkaError | None, msg: Message) -> None:
            if self.answered:
                self.destination.late_report(err)
                return
            self.reports[index] = (err, msg)
            self.pending -= 1
        return report


class KafkaDestination(Destination):
    # Deliveries wait on the network: the relay claims and settles the next batch meanwhile.
    pipelined = True

    def __init__(self, bootstrap_servers: str, *, name: str | None = None, timeout_s: float = 5.0,
                 topic_prefix: str = "", config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        clashes = sorted(set(config) & set(_GUARANTEED))
        if clashes:
            raise ValueError(f"the Kafka destination sets {', '.join(clashes)} itself (its delivery guarantees)")
        self.name = name or f"kafka://{bootstrap_servers.split(',')[0]}"
        self.topic_prefix = topic_prefix
        self.timeout_s = timeout_s
        secrets = [str(config[key]) for key in _SECRET_SETTINGS if config.get(key)]
        user = config.get("sasl.username")
        self.scrub = Scrubber(f"kafka://{bootstrap_servers}", token=secrets[0] if secrets else None,
                              credentials=(str(user), secrets[0]) if user and secrets else None)
        timeout_ms = max(1, int(timeout_s * 1000))
        self._settings: dict[str, Any] = {
            # Java clients' partitioner: a key lands in the partition a Java producer would choose too.
            "partitioner": "murmur2_random",
            "topic.metadata.propagation.max.ms": min(30_000, max(100, timeout_ms // 2)),
            # Back within a second or two of a broker's return (the default backs off to 10 s).
            "reconnect.backoff.max.ms": 1_000,
            "client.id": "outbox-pipelines",
            **config,
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": timeout_ms,
            "error_cb": self._on_error,
            "logger": _ClientLog(),
        }
        self._producer: Producer | None = None
        self._broken: str | None = None  # why the producer must be recreated (a fatal error)
        # The last error the client reported on its own (connection, authentication), until a record is sent.
        self._client_error: KafkaError | None = None
        self._topics: dict[str, str | None] = {}  # full topic name -> its problem (cached: names repeat)
        # What happened to records after their batch was answered (see the module docstring).
        self.abandoned = 0
        self.late_deliveries = 0
        self.producers_created = 0
        # Created now, not at the first batch: it connects and obtains its producer id while the relay
        # connects to the database and claims (up to half a second, librdkafka's producer-id timer), and
        # a setting librdkafka refuses fails here, when the relay starts.
        try:
            self._ready_producer()
        except KafkaException as exc:
            raise ValueError(f"{self.name}: the Kafka client refused its settings: {self._text(str(exc))}") from None

    # -- the producer ------------------------------------------------------
    def _ready_producer(self) -> Producer:
        if self._producer is not None and self._broken is not None:
            log.warning("%s: recreating the Kafka producer after a fatal error: %s", self.name, self._broken)
            self._drop_producer()
        if self._producer is None:
            self._producer = Producer(self._settings)
            self._broken = None
            self.producers_created += 1
        return self._producer

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            # What it still holds was answered "retry" already: drop it rather than deliver it twice.
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.flush(0)
        except Exception:  # noqa: BLE001 - a broken producer may raise anything; it is being dropped
            log.debug("dropping the Kafka producer raised", exc_info=True)

    def _on_error(self, err: KafkaError) -> None:
        """The client's own errors (not about one record): kept to explain records that time out."""
        self._client_error = err

    def late_report(self, err: KafkaError | None) -> None:
        """A report for a record whose batch was answered already (retry): delivered late is a duplicate."""
        if err is None:
            self.late_deliveries += 1
            log.warning("%s: a record answered 'retry' (no report in time) was delivered after all; its next "
                        "attempt will deliver it again (%d such duplicates so far)", self.name, self.late_deliveries)

    # -- delivering ---------------------------------------------------------
    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(messages)
        batch = _Batch(len(messages), self)
        started = time.monotonic()
        deadline = started + self.timeout_s + REPORT_GRACE_S
        producer = self._ready_producer()
        for index, message in enumerate(messages):
            outcome = self._produce(producer, batch, index, message, deadline)
            if outcome is not None:
                outcomes[index] = outcome
            if self._broken is not None:
                break
        self._await_reports(producer, batch, deadline)
        batch.answered = True
        result = [outcome or self._outcome_of(batch.reports[i], started) for i, outcome in enumerate(outcomes)]
        if any(outcome.kind == "sent" for outcome in result):
            # The cluster takes records: what the client complained of before is over. (Kept until then:
            # librdkafka reports a repeated connection or authentication failure once, not at every batch.)
            self._client_error = None
        return result

    def _topic_problem(self, topic: str) -> str | None:
        if topic not in self._topics:
            if len(self._topics) >= _TOPIC_CACHE_SIZE:
                self._topics.clear()  # topics named by the data (per tenant ...) must not grow it without end
            self._topics[topic] = topic_problem(topic)
        return self._topics[topic]

    def _produce(self, producer: Producer, batch: _Batch, index: int, message: ClaimedMessage,
                 deadline: float) -> Outcome | None:
        """Hand one record to the producer; an Outcome when it cannot be (None: its report will come)."""
        if self._broken is not None:
            return Outcome.retry(m.UNKNOWN, f"not sent: the Kafka producer failed: {self._broken}")
        topic = self.topic_prefix + message.topic
        problem = self._topic_problem(topic)
        if problem is not None:
            return Outcome.dead(m.BAD_REQUEST, problem)
        try:
            value = _ENCODE(message.payload).encode()
        except (TypeError, ValueError) as exc:
            return Outcome.dead(m.BAD_REQUEST, f"the payload cannot be written as JSON: {exc}")
        while True:
            try:
                producer.produce(topic, value, message.ordering_key or message.event_id,
                                 on_delivery=batch.reporter(index), headers=record_headers(message))
                batch.pending += 1
                return None
            except BufferError:
                # The local queue is full: serve reports (which frees it) and try again, until the deadline.
                if time.monotonic() >= deadline:
                    return Outcome.retry(m.NETWORK_TIMEOUT, "not sent: the producer's local queue stayed full "
                                                            f"for {self.timeout_s:g} s (the cluster is slow or away)")
                self._serve(producer, _QUEUE_FULL_POLL_S)
            except KafkaException as exc:
                return self._error_outcome(exc.args[0], refused_at_produce=True)
            except (TypeError, ValueError, UnicodeError) as exc:
                return Outcome.dead(m.BAD_REQUEST, f"the Kafka client refused the record: {self._text(str(exc))}")

    def _serve(self, producer: Producer, timeout_s: float, *, flush: bool = False) -> None:
        """Serve delivery reports; a fatal error raised while serving them marks the producer broken."""
        try:
            if flush:
                producer.flush(timeout_s)
            else:
                producer.poll(timeout_s)
        except Exception as exc:  # noqa: BLE001 - confluent-kafka raises the fatal error from poll/flush
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__ or exc
            error = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
            self._broken = self._text(error.str() if isinstance(error, KafkaError) else f"{type(cause).__name__}: "
                                      f"{cause}")
            log.error("%s: the Kafka producer failed: %s", self.name, self._broken)

    def _await_reports(self, producer: Producer, batch: _Batch, deadline: float) -> None:
        """Until every record of the batch is reported, the producer broke, or the deadline passed."""
        while batch.pending > 0 and self._broken is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # flush() sends at once (linger ignored) and returns when the producer holds nothing more; with
            # records of an abandoned batch still queued it would wait for them too, so it waits in slices.
            self._serve(producer, left if len(producer) <= batch.pending else min(left, 0.1), flush=True)
        if batch.pending > 0 and self._broken is None:
            self.abandoned += batch.pending
            log.warning("%s: %d record(s) unreported %.1f s after they were produced: answered retry; if they "
                        "are delivered after all, their next attempt is a duplicate", self.name, batch.pending,
                        self.timeout_s + REPORT_GRACE_S)

    # -- outcomes -----------------------------------------------------------
    def _outcome_of(self, report: tuple[KafkaError | None, Message] | None, started: float) -> Outcome:
        if report is None:
            if self._broken is not None:
                return Outcome.retry(m.UNKNOWN, f"no delivery report: the Kafka producer failed: {self._broken}")
            return Outcome.retry(m.NETWORK_TIMEOUT, f"no delivery report within {time.monotonic() - started:.1f} s"
                                 + self._client_hint())
        err, msg = report
        if err is None:
            return _sent(f"{msg.topic()}/{msg.partition()}@{msg.offset()}")
        return self._error_outcome(err)

    def _client_hint(self) -> str:
        error = self._client_error
        return f" (the client reported: {self._text(error.str())})" if error is not None else ""

    def _error_outcome(self, err: KafkaError, *, refused_at_produce: bool = False) -> Outcome:
        code = err.code()
        text = self._text(f"{err.name()}: {err.str()}")
        # The message's own refusals first: they hold whatever else went wrong in the batch.
        if code in _TOO_LARGE:
            where = "the producer's message.max.bytes" if refused_at_produce else "the broker's max.message.bytes"
            return Outcome.dead(m.BAD_REQUEST, f"the record is larger than {where} allows ({text})")
        if code in _BAD_MESSAGE:
            return Outcome.dead(m.BAD_REQUEST, f"Kafka refused the record: {text}")
        if code in _NO_TOPIC:
            return Outcome.dead(m.NO_SUBSCRIBERS, f"the topic does not exist and the cluster does not create it "
                                                  f"({text}); create it, then replay")
        if err.fatal() or code in _PRODUCER_BROKEN or self._broken is not None:
            # After a fatal error librdkafka fails what it still held (purged, timed out): all of it is the
            # producer's failure, not the cluster's.
            self._broken = self._broken or text
            return Outcome.retry(m.UNKNOWN, f"the idempotent Kafka producer failed ({self._broken}); it is "
                                            f"recreated for the next batch (this record: {text})")
        if code in _REFUSED or (code in _UNREACHABLE and self._client_error is not None
                                and self._client_error.code() in _REFUSED):
            return Outcome.retry(m.UNAUTHORIZED, f"Kafka refused the producer's credentials or ACLs: {text}"
                                 + self._client_hint())
        if code in _UNREACHABLE:
            return Outcome.retry(m.NETWORK_TIMEOUT, f"not delivered: {text}" + self._client_hint())
        if err.retriable():
            return Outcome.retry(m.BROKER_5XX, f"the broker failed the write: {text}")
        return Outcome.retry(m.UNKNOWN, f"Kafka error: {text}")

    def _text(self, text: str) -> str:
        return redact_text(self.scrub(text) or "")

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            # Every batch was answered: what remains belongs to abandoned batches (answered retry).
            producer.purge(in_queue=True, in_flight=False, blocking=False)
            producer.flush(min(self.timeout_s, 5.0))
        except Exception:  # noqa: BLE001 - closing must not raise
            log.debug("closing the Kafka producer raised", exc_info=True)


def build(table: "TableSettings") -> KafkaDestination:
    """The destination of a ``destination = "kafka"`` table (wiring.build_broker_destination calls this)."""
    broker = table.broker
    assert broker is not None and broker.kind == "kafka"
    return KafkaDestination(broker.url, name=broker.shown, timeout_s=table.timeout_s,
                            topic_prefix=broker.topic_prefix, config=broker.client_config)
