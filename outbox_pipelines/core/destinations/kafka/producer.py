"""The Kafka destination's producer: its settings, its creation, serving its delivery reports, what the
client reports on its own, and its recreation after a fatal error.

One idempotent Producer per destination, made with it (a refused setting fails the start); the settings that
carry the guarantees cannot be overridden; a producer in the fatal state is replaced before the next batch.
Why: docs/explanation/transports.md, "Kafka: the producer".
"""

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outbox_pipelines.core.redaction import Scrubber

log = logging.getLogger("outbox_pipelines.kafka")

# Settings that carry the destination's guarantees: ``config`` may not change them.
_GUARANTEED = (
    "enable.idempotence",
    "acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "bootstrap.servers",
    "on_delivery",
    "error_cb",
    "logger",
)
_SECRET_SETTINGS = ("sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password", "ssl.keystore.password")
# The same client complaint (a broker refusing connections during an outage) is logged once this often.
LOG_EVERY_S = 30.0


def config_scrubber(bootstrap_servers: str, config: Mapping[str, Any]) -> Scrubber:
    """A Scrubber of the secrets ``config`` holds (a SASL password, a key's password ...)."""
    secrets = [str(config[key]) for key in _SECRET_SETTINGS if config.get(key)]
    user = config.get("sasl.username")
    return Scrubber(
        f"kafka://{bootstrap_servers}",
        token=secrets[0] if secrets else None,
        credentials=(str(user), secrets[0]) if user and secrets else None,
    )


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
        except Exception:  # logging must never fail a delivery
            pass


class ProducerKeeper:
    """The destination's producer, ready for each batch: created (again, after a fatal error) when needed."""

    def __init__(
        self,
        bootstrap_servers: str,
        config: Mapping[str, Any],
        *,
        name: str,
        timeout_s: float,
        text: Callable[[str], str],
    ) -> None:
        clashes = sorted(set(config) & set(_GUARANTEED))
        if clashes:
            raise ValueError(f"the Kafka destination sets {', '.join(clashes)} itself (its delivery guarantees)")
        self.name = name
        self._text = text  # scrubs a client's error text of the destination's secrets
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
        self.broken: str | None = None  # why the producer must be recreated (a fatal error)
        # The last error the client reported on its own (connection, authentication), until a record is sent.
        self.client_error: KafkaError | None = None
        self.created = 0

    def ready(self) -> Producer:
        """The producer for the next batch (KafkaException when librdkafka refuses the settings)."""
        if self._producer is not None and self.broken is not None:
            log.warning("%s: recreating the Kafka producer after a fatal error: %s", self.name, self.broken)
            self._drop()
        if self._producer is None:
            self._producer = Producer(self._settings)
            self.broken = None
            self.created += 1
        return self._producer

    def _drop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # What it still holds was answered "retry" already: drop it rather than deliver it twice.
            _let_go(producer, in_flight=True, flush_s=0, doing="dropping")

    def _on_error(self, err: KafkaError) -> None:
        """The client's own errors (not about one record): kept to explain records that time out. "All
        brokers are down" follows each failed connection: it keeps the reason they are down it follows."""
        if err.code() == KafkaError._ALL_BROKERS_DOWN and self.client_error is not None:
            return
        self.client_error = err

    def serve(self, producer: Producer, timeout_s: float, *, flush: bool = False) -> None:
        """Serve delivery reports; a fatal error raised while serving them marks the producer broken."""
        try:
            if flush:
                producer.flush(timeout_s)
            else:
                producer.poll(timeout_s)
        except Exception as exc:  # confluent-kafka raises the fatal error from poll/flush
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__ or exc
            error = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
            self.broken = self._text(
                error.str() if isinstance(error, KafkaError) else f"{type(cause).__name__}: {cause}"
            )
            log.error("%s: the Kafka producer failed: %s", self.name, self.broken)

    def close(self, timeout_s: float) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Every batch was answered: what remains belongs to abandoned batches (answered retry).
            _let_go(producer, in_flight=False, flush_s=min(timeout_s, 5.0), doing="closing")


def _let_go(producer: Producer, *, in_flight: bool, flush_s: float, doing: str) -> None:
    """Purge what ``producer`` holds (queued, and in flight too if ``in_flight``) and flush it for at most
    ``flush_s``; a producer being let go may raise anything (a broken one), which must not escape."""
    try:
        producer.purge(in_queue=True, in_flight=in_flight, blocking=False)
        producer.flush(flush_s)
    except Exception:  # see the docstring
        log.debug("%s the Kafka producer raised", doing, exc_info=True)
