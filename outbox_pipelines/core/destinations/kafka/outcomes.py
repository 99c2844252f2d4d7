"""What each error librdkafka reports means for a record: the Kafka destination's outcome table (``ROWS``;
docs/destinations.md shows it, rendered by ``outcome_tables``), and the topic names Kafka can hold.

Why each row is as it is: docs/explanation/transports.md, "Kafka: what each error means".
"""

import re
from collections.abc import Callable

from confluent_kafka import KafkaError

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.outcome_rows import OutcomeRow
from outbox_pipelines.core.models import Outcome, OutcomeKind

# What Kafka accepts as a topic name (its Topic.validate): these characters, 1 to 249 of them, not "."/"..".
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

_E = KafkaError
_TOO_LARGE = frozenset({_E.MSG_SIZE_TOO_LARGE})
_INVALID_TOPIC_EXCEPTION = 17  # not among confluent-kafka's KafkaError constants
_BAD_MESSAGE = frozenset(
    {
        _E.INVALID_RECORD,
        _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _E.POLICY_VIOLATION,
        _INVALID_TOPIC_EXCEPTION,
        _E._INVALID_ARG,
        _E._BAD_MSG,
        _E._INVALID_TYPE,
    }
)
_NO_TOPIC = frozenset({_E.UNKNOWN_TOPIC_OR_PART, _E._UNKNOWN_TOPIC, _E._UNKNOWN_PARTITION, _E.UNKNOWN_TOPIC_ID})
_REFUSED = frozenset(
    {
        _E.TOPIC_AUTHORIZATION_FAILED,
        _E.CLUSTER_AUTHORIZATION_FAILED,
        _E._AUTHENTICATION,
        _E.SASL_AUTHENTICATION_FAILED,
    }
)
_UNREACHABLE = frozenset(
    {
        _E._MSG_TIMED_OUT,
        _E._TIMED_OUT,
        _E._TRANSPORT,
        _E._ALL_BROKERS_DOWN,
        _E._RESOLVE,
        _E.NETWORK_EXCEPTION,
        _E._QUEUE_FULL,
        _E._PURGE_QUEUE,
        _E._PURGE_INFLIGHT,
    }
)
_PRODUCER_BROKEN = frozenset(
    {
        _E._FATAL,
        _E._FENCED,
        _E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        _E.INVALID_PRODUCER_EPOCH,
        _E.PRODUCER_FENCED,
        _E.UNKNOWN_PRODUCER_ID,
        _E._INCONSISTENT,
    }
)
# The message's own refusals: they hold whatever else went wrong in the batch.
_THE_MESSAGES = _TOO_LARGE | _BAD_MESSAGE | _NO_TOPIC

# The table, in the docs' order. Every outcome here is one of these rows'.
DELIVERED = OutcomeRow("delivered", OutcomeKind.SENT, then=", ref `topic/partition@offset`")
BAD_RECORD = OutcomeRow(
    "`MSG_SIZE_TOO_LARGE` (the broker's or the producer's limit), `INVALID_RECORD`, "
    "`POLICY_VIOLATION`, a topic name Kafka cannot hold (refused before producing)",
    OutcomeKind.DEAD,
    m.BAD_REQUEST,
)
NO_TOPIC = OutcomeRow(
    "`UNKNOWN_TOPIC_OR_PART` (the cluster does not create topics)",
    OutcomeKind.DEAD,
    m.NO_SUBSCRIBERS,
    " (replay once the topic exists); not the circuit, which would hold the table's other topics",
)
REFUSED = OutcomeRow(
    "topic or cluster authorization failed, SASL refused", OutcomeKind.RETRY, m.UNAUTHORIZED, " (circuit)"
)
TLS_FAILED = OutcomeRow(
    "`_SSL`: the TLS handshake failed (a certificate that cannot be verified), also as the client's last report",
    OutcomeKind.RETRY,
    m.TLS_ERROR,
    " (circuit)",
)
NAME_NOT_RESOLVED = OutcomeRow(
    "`_RESOLVE`: a broker's host name does not resolve, also as the client's last report",
    OutcomeKind.RETRY,
    m.DNS_ERROR,
    " (circuit)",
)
CONNECTION_REFUSED = OutcomeRow(
    "timed out or unreachable while the client reported a refused connection (nothing listens there)",
    OutcomeKind.RETRY,
    m.CONNECTION_REFUSED,
    " (circuit)",
)
UNREACHABLE = OutcomeRow(
    "timed out, brokers unreachable, transport errors, local queue full",
    OutcomeKind.RETRY,
    m.NETWORK_TIMEOUT,
    " (circuit)",
)
BROKER_FAILED = OutcomeRow(
    "other retriable broker errors (not enough replicas, leader moving, storage error)",
    OutcomeKind.RETRY,
    m.BROKER_5XX,
    " (circuit)",
)
PRODUCER_FAILED = OutcomeRow(
    "a fatal idempotent-producer error (the producer is recreated before the next batch)",
    OutcomeKind.RETRY,
    m.UNKNOWN,
    " (circuit)",
)
UNFORESEEN = OutcomeRow("anything unforeseen", OutcomeKind.RETRY, m.UNKNOWN, " (circuit)")
ROWS = (
    DELIVERED,
    BAD_RECORD,
    NO_TOPIC,
    REFUSED,
    TLS_FAILED,
    NAME_NOT_RESOLVED,
    CONNECTION_REFUSED,
    UNREACHABLE,
    BROKER_FAILED,
    PRODUCER_FAILED,
    UNFORESEEN,
)
# sent()'s fields, read once: it builds an Outcome per record.
_DELIVERED_KIND, _DELIVERED_CODE = DELIVERED.kind, DELIVERED.code


def topic_problem(topic: str) -> str | None:
    """Why Kafka cannot hold a topic of this name, or None."""
    if not _TOPIC.fullmatch(topic):
        if len(topic) > 249:
            return f"the Kafka topic name is {len(topic)} characters long; Kafka takes at most 249"
        return f"the Kafka topic name {topic[:100]!r} is empty or holds characters other than A-Z a-z 0-9 . _ -"
    if topic in (".", ".."):
        return f"{topic!r} is not a Kafka topic name"
    return None


def sent(ref: str) -> Outcome:
    """DELIVERED.outcome(ref=ref) without the frozen dataclass's __init__ (five object.__setattr__ calls: a
    tenth of a record's cost here), as models.EnqueueResult.new does."""
    outcome = object.__new__(Outcome)
    outcome.__dict__.update(kind=_DELIVERED_KIND, code=_DELIVERED_CODE, error=None, ref=ref, delay_s=None)
    return outcome


def breaks_producer(err: KafkaError) -> bool:
    """True when ``err`` leaves the idempotent producer unable to go on (it must be recreated)."""
    return err.code() not in _THE_MESSAGES and (err.fatal() or err.code() in _PRODUCER_BROKEN)


def client_hint(client_error: KafkaError | None, text: Callable[[str], str]) -> str:
    """What the client last reported on its own, for an outcome's text ("" when nothing)."""
    return f" (the client reported: {text(client_error.str())})" if client_error is not None else ""


def error_outcome(
    err: KafkaError,
    text: Callable[[str], str],
    *,
    refused_at_produce: bool,
    broken: str | None,
    client_error: KafkaError | None,
) -> Outcome:
    """The outcome of a record librdkafka refused or reported failed (``broken``: why the producer failed,
    if it did; ``client_error``: what the client last reported on its own; ``text`` scrubs a text)."""
    code = err.code()
    what = text(f"{err.name()}: {err.str()}")
    # The message's own refusals first: they hold whatever else went wrong in the batch.
    if code in _TOO_LARGE:
        where = "the producer's message.max.bytes" if refused_at_produce else "the broker's max.message.bytes"
        return BAD_RECORD.outcome(f"the record is larger than {where} allows ({what})")
    if code in _BAD_MESSAGE:
        return BAD_RECORD.outcome(f"Kafka refused the record: {what}")
    if code in _NO_TOPIC:
        return NO_TOPIC.outcome(
            f"the topic does not exist and the cluster does not create it ({what}); create it, then replay"
        )
    if broken is not None:
        # After a fatal error librdkafka fails what it still held (purged, timed out): all of it is the
        # producer's failure, not the cluster's.
        return PRODUCER_FAILED.outcome(
            f"the idempotent Kafka producer failed ({broken}); it is recreated for the next batch (this record: {what})"
        )
    if code in _REFUSED or (code in _UNREACHABLE and client_error is not None and client_error.code() in _REFUSED):
        return REFUSED.outcome(
            f"Kafka refused the producer's credentials or ACLs: {what}" + client_hint(client_error, text)
        )
    if code in (_E._SSL, _E._RESOLVE) or code in _UNREACHABLE:
        return _network_row(code, client_error).outcome(f"not delivered: {what}" + client_hint(client_error, text))
    if err.retriable():
        return BROKER_FAILED.outcome(f"the broker failed the write: {what}")
    return UNFORESEEN.outcome(f"Kafka error: {what}")


def _network_row(code: int, client_error: KafkaError | None) -> OutcomeRow:
    """Why the brokers could not be reached, by the record's error or what the client last reported on its own
    (librdkafka: "Connect to ipv4#127.0.0.1:9092 failed: Connection refused")."""
    said = client_error.code() if client_error is not None else None
    if _E._SSL in (code, said):
        return TLS_FAILED
    if _E._RESOLVE in (code, said):
        return NAME_NOT_RESOLVED
    if client_error is not None and "connection refused" in client_error.str().lower():
        return CONNECTION_REFUSED
    return UNREACHABLE
