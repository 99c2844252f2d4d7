"""Kafka destination (``destination = "kafka"``): one idempotent confluent-kafka Producer per destination.

The relay calls ``KafkaDestination`` (built by ``build``). A record per message, keyed by its ordering key (else
its event_id), ``sent`` only on a delivery report without error; a batch never takes much longer than the
table's ``timeout``. Why: docs/explanation/transports.md, "Kafka".
"""

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination, server_of
from outbox_pipelines.core.destinations.kafka.outcomes import (
    breaks_producer,
    client_hint,
    error_outcome,
    sent,
    topic_problem,
)
from outbox_pipelines.core.destinations.kafka.producer import ProducerKeeper, config_scrubber
from outbox_pipelines.core.destinations.trace_context import valid_traceparent, valid_tracestate
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.redaction import mask_url, redact_text

if TYPE_CHECKING:
    from outbox_pipelines.core.settings import TableSettings

log = logging.getLogger("outbox_pipelines.kafka")

# librdkafka checks message timeouts about once a second: a timed-out record is reported up to ~1 s late.
REPORT_GRACE_S = 1.5
_TOPIC_CACHE_SIZE = 10_000
# How long a BufferError (local queue full) waits for reports to drain before the next try.
_QUEUE_FULL_POLL_S = 0.05

_CONTENT_TYPE = ("content-type", "application/json")
# One encoder for every payload: json.dumps with non-default options builds a new one per call (2 µs).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def record_headers(message: ClaimedMessage) -> list[tuple[str, str | bytes | None]]:
    """The record's headers: the idempotency key first, then what the HTTP destination sends (the outbox
    topic, the attempt, a well-formed traceparent and tracestate, the trace and tenant ids). Ours come before
    any a Kafka client instrumentation appends: its getters read a header's first value."""
    headers: list[tuple[str, str | bytes | None]] = [
        ("idempotency-key", message.event_id),
        ("outbox-topic", message.topic),
        ("outbox-attempt", str(message.attempts)),
        _CONTENT_TYPE,
    ]
    extra = message.headers
    if extra and isinstance(extra, dict):
        traceparent = valid_traceparent(extra.get("traceparent"))
        if traceparent:
            headers.append(("traceparent", traceparent))
            tracestate = valid_tracestate(extra.get("tracestate"))
            if tracestate:
                headers.append(("tracestate", tracestate))
        trace_id = extra.get("trace_id")
        if trace_id is not None:
            headers.append(("trace-id", str(trace_id)))
    if message.tenant_id:
        headers.append(("tenant-id", message.tenant_id))
    return headers


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
    messaging_system = "kafka"

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        name: str | None = None,
        timeout_s: float = 5.0,
        topic_prefix: str = "",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        if "@" in bootstrap_servers:  # a credential pasted in: never shown, never sent to librdkafka's logs
            raise ConfigError(
                f"Kafka bootstrap_servers {mask_url(bootstrap_servers)!r} holds a user-info (user:password@): "
                "pass the credentials as sasl.username and sasl.password in config, never in bootstrap_servers"
            )
        config = dict(config or {})
        self.name = name or f"kafka://{bootstrap_servers.split(',')[0]}"
        self.topic_prefix = topic_prefix
        self.server = server_of(bootstrap_servers.split(",")[0].strip(), 9092)
        self.timeout_s = timeout_s
        self.scrub = config_scrubber(bootstrap_servers, config)
        self._keeper = ProducerKeeper(bootstrap_servers, config, name=self.name, timeout_s=timeout_s, text=self._text)
        self._topics: dict[str, str | None] = {}  # full topic name -> its problem (cached: names repeat)
        # What happened to records after their batch was answered (see the module docstring).
        self.abandoned = 0
        self.late_deliveries = 0
        # Created now, not at the first batch: it connects and obtains its producer id while the relay
        # connects to the database and claims (up to half a second, librdkafka's producer-id timer), and
        # a setting librdkafka refuses fails here, when the relay starts.
        try:
            self._keeper.ready()
        except KafkaException as exc:
            raise ValueError(f"{self.name}: the Kafka client refused its settings: {self._text(str(exc))}") from None

    def destination_name(self, message: ClaimedMessage) -> str:
        return self.topic_prefix + message.topic

    @property
    def producers_created(self) -> int:
        return self._keeper.created

    def late_report(self, err: KafkaError | None) -> None:
        """A report for a record whose batch was answered already (retry): delivered late is a duplicate."""
        if err is None:
            self.late_deliveries += 1
            log.warning(
                "%s: a record answered 'retry' (no report in time) was delivered after all; its next "
                "attempt will deliver it again (%d such duplicates so far)",
                self.name,
                self.late_deliveries,
            )

    # -- delivering ---------------------------------------------------------
    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(messages)
        batch = _Batch(len(messages), self)
        started = time.monotonic()
        deadline = started + self.timeout_s + REPORT_GRACE_S
        keeper = self._keeper
        producer = keeper.ready()
        for index, message in enumerate(messages):
            outcome = self._produce(producer, batch, index, message, deadline)
            if outcome is not None:
                outcomes[index] = outcome
            if keeper.broken is not None:
                break
        self._await_reports(producer, batch, deadline)
        batch.answered = True
        result = [outcome or self._outcome_of(batch.reports[i], started) for i, outcome in enumerate(outcomes)]
        if any(outcome.kind == m.OutcomeKind.SENT for outcome in result):
            # The cluster takes records: what the client complained of before is over. (Kept until then:
            # librdkafka reports a repeated connection or authentication failure once, not at every batch.)
            keeper.client_error = None
        return result

    def _topic_problem(self, topic: str) -> str | None:
        if topic not in self._topics:
            if len(self._topics) >= _TOPIC_CACHE_SIZE:
                self._topics.clear()  # topics named by the data (per tenant ...) must not grow it without end
            self._topics[topic] = topic_problem(topic)
        return self._topics[topic]

    def _produce(
        self, producer: Producer, batch: _Batch, index: int, message: ClaimedMessage, deadline: float
    ) -> Outcome | None:
        """Hand one record to the producer; an Outcome when it cannot be (None: its report will come)."""
        if self._keeper.broken is not None:
            return Outcome.retry(m.UNKNOWN, f"not sent: the Kafka producer failed: {self._keeper.broken}")
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
                producer.produce(
                    topic,
                    value,
                    message.ordering_key or message.event_id,
                    on_delivery=batch.reporter(index),
                    headers=record_headers(message),
                )
                batch.pending += 1
                return None
            except BufferError:
                # The local queue is full: serve reports (which frees it) and try again, until the deadline.
                if time.monotonic() >= deadline:
                    return Outcome.retry(
                        m.NETWORK_TIMEOUT,
                        "not sent: the producer's local queue stayed full "
                        f"for {self.timeout_s:g} s (the cluster is slow or away)",
                    )
                self._keeper.serve(producer, _QUEUE_FULL_POLL_S)
            except KafkaException as exc:
                return self._error_outcome(exc.args[0], refused_at_produce=True)
            except (TypeError, ValueError, UnicodeError) as exc:
                return Outcome.dead(m.BAD_REQUEST, f"the Kafka client refused the record: {self._text(str(exc))}")

    def _await_reports(self, producer: Producer, batch: _Batch, deadline: float) -> None:
        """Until every record of the batch is reported, the producer broke, or the deadline passed."""
        keeper = self._keeper
        while batch.pending > 0 and keeper.broken is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # flush() sends at once (linger ignored) and returns when the producer holds nothing more; with
            # records of an abandoned batch still queued it would wait for them too, so it waits in slices.
            keeper.serve(producer, left if len(producer) <= batch.pending else min(left, 0.1), flush=True)
        if batch.pending > 0 and keeper.broken is None:
            self.abandoned += batch.pending
            log.warning(
                "%s: %d record(s) unreported %.1f s after they were produced: answered retry; if they "
                "are delivered after all, their next attempt is a duplicate",
                self.name,
                batch.pending,
                self.timeout_s + REPORT_GRACE_S,
            )

    # -- outcomes -----------------------------------------------------------
    def _outcome_of(self, report: tuple[KafkaError | None, Message] | None, started: float) -> Outcome:
        if report is None:
            if self._keeper.broken is not None:
                return Outcome.retry(m.UNKNOWN, f"no delivery report: the Kafka producer failed: {self._keeper.broken}")
            return Outcome.retry(
                m.NETWORK_TIMEOUT,
                f"no delivery report within {time.monotonic() - started:.1f} s"
                + client_hint(self._keeper.client_error, self._text),
            )
        err, msg = report
        if err is None:
            return sent(f"{msg.topic()}/{msg.partition()}@{msg.offset()}")
        return self._error_outcome(err)

    def _error_outcome(self, err: KafkaError, *, refused_at_produce: bool = False) -> Outcome:
        keeper = self._keeper
        if keeper.broken is None and breaks_producer(err):
            keeper.broken = self._text(f"{err.name()}: {err.str()}")  # recreated before the next batch
        return error_outcome(
            err,
            self._text,
            refused_at_produce=refused_at_produce,
            broken=keeper.broken,
            client_error=keeper.client_error,
        )

    def _text(self, text: str) -> str:
        return redact_text(self.scrub(text) or "")

    def close(self) -> None:
        self._keeper.close(self.timeout_s)


def build(table: "TableSettings") -> KafkaDestination:
    """The destination of a ``destination = "kafka"`` table (wiring.build_broker_destination calls this)."""
    broker = table.broker
    assert broker is not None and broker.kind == "kafka"
    return KafkaDestination(
        broker.url,
        name=broker.shown,
        timeout_s=table.timeout_s,
        topic_prefix=broker.topic_prefix,
        config=broker.client_config,
    )
