"""Every key a ``[tables.NAME]`` section may carry: its kind, its default as a user writes it, what it means,
and the destinations that read it.

Sections are checked against ``TABLE_KEYS``, so a key cannot be accepted without being documented. A wing's URL
destinations take ``url`` and ``token_env`` as ``http`` does.
"""

from dataclasses import dataclass

# What a key's value is; "choice" takes one of the key's ``choices``.
KINDS = (
    "choice",
    "duration",
    "count",
    "whole number",
    "fraction",
    "true/false",
    "text",
    "name",
    "URL",
    "host:port list",
    "variable name",
    "module:attribute",
    "list of text",
)
# What a key is about, in the order the reference lists them.
GROUPS = ("where", "delivery", "broker", "kafka_security", "retry", "relay", "cleaner", "checks")


@dataclass(frozen=True)
class TableKey:
    """One key of a ``[tables.NAME]`` section."""

    name: str
    group: str
    kind: str
    # The default as written in TOML ('"5s"', '32', 'false'), which a section without the key gets; None when no
    # one value is (``default_note`` says what then).
    default: str | None
    meaning: str
    # The destinations that read it; () for every table.
    applies_to: tuple[str, ...] = ()
    # A choice's words, in the order error messages list them.
    choices: tuple[str, ...] = ()
    # The environment variable that sets the default, when it does (``default`` is then that variable's default).
    default_from: str | None = None
    # What the default is when no single value says it, or a word more about it.
    default_note: str = ""


_HTTP, _BROKERS = ("http",), ("nats", "rabbitmq", "kafka")


def _thresholds(stem: str, kind: str, warn: str, error: str, what: str) -> tuple[TableKey, TableKey]:
    """A check's two thresholds: it turns WARN at ``warn``, ERROR at ``error``."""
    return (
        TableKey(f"{stem}_warn", "checks", kind, warn, f"{what}: the check turns WARN at this"),
        TableKey(f"{stem}_error", "checks", kind, error, f"{what}: the check turns ERROR at this"),
    )


# fmt: off
# (The registry reads as a table, a few lines a key; the formatter would give every field a line of its own.)
TABLE_KEY_REGISTRY: tuple[TableKey, ...] = (
    # Where messages go, and with which credential.
    TableKey("destination", "where", "choice", None, "where messages go; `paper` marks them sent and delivers "
             "nothing", choices=("http", "handlers", "paper", "nats", "rabbitmq", "kafka"),
             default_note="none: a table names one (a wing may add kinds)"),
    TableKey("url", "where", "URL", None, "the HTTP endpoint, or the broker's URL (`nats://`, `amqp://`)",
             applies_to=("http", "nats", "rabbitmq"), default_note="none: required with these"),
    TableKey("url_env", "where", "variable name", None, "the variable holding the url instead (kafka: the bootstrap "
             "servers), so its credential stays out of the file", applies_to=("http", *_BROKERS)),
    TableKey("token_env", "where", "variable name", None, "the variable holding the table's bearer token (nats: "
             "its NATS token); never the token itself", applies_to=("http", "nats"),
             default_note="`OUTBOX_BROKER_TOKEN` for a url at `OUTBOX_BROKER_URL`'s origin, else none"),
    TableKey("signing_secret_env", "where", "variable name", None, "the variable holding a Standard Webhooks "
             "secret (`whsec_...`; two, space-separated, while rotating): every delivery is signed",
             applies_to=_HTTP),
    TableKey("handlers", "where", "module:attribute", None, "the HandlerRegistry run in-process "
             "(`package.module:registry`)", applies_to=("handlers",), default_note="none: required with handlers"),
    # How one delivery is made.
    TableKey("timeout", "delivery", "duration", '"5s"', "how long one delivery may take (handlers: how long an "
             "`async def` handler may run before it is cancelled)", applies_to=("http", "handlers", *_BROKERS)),
    TableKey("transport", "delivery", "choice", '"aiohttp-native"', "the HTTP client", applies_to=_HTTP,
             choices=("aiohttp-native", "aiohttp", "httpx-async", "httpx-sync")),
    TableKey("concurrency", "delivery", "whole number", "32", "deliveries in flight per relay (at most batch_size)",
             applies_to=("http", "nats", "rabbitmq")),
    TableKey("parallelism", "delivery", "whole number", "4", "threads running the handlers (the relay's own is "
             "one of them)", applies_to=("handlers",), default_from="OUTBOX_PARALLELISM"),
    TableKey("already_processed", "delivery", "list of text",
             '["status=already_processed", "code=already_processed", "error=already_processed", '
             '"already processed"]',
             "what a 409's body must say to count as delivered: `field=value` rules (dotted for nesting) or "
             "phrases; `[]` makes every 409 a rejection", applies_to=_HTTP),
    # A broker's names.
    TableKey("bootstrap_servers", "broker", "host:port list", None, "the Kafka brokers "
             "(`host:9092,host2:9092`)", applies_to=("kafka",), default_note="none: required (or url_env)"),
    TableKey("topic_prefix", "broker", "text", '""', "put in front of each message's topic: the NATS subject, "
             "the Kafka topic, the RabbitMQ routing key", applies_to=_BROKERS),
    TableKey("exchange", "broker", "text", None, "the exchange published to (durable, type topic, declared at "
             "connect)", applies_to=("rabbitmq",), default_note="the table's name"),
    # Kafka's security (librdkafka's settings); the password is read from the environment only.
    TableKey("security_protocol", "kafka_security", "choice", None, "librdkafka's `security.protocol`",
             applies_to=("kafka",), choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
             default_note="librdkafka's (`PLAINTEXT`); `SASL_SSL` with sasl_username"),
    TableKey("sasl_mechanism", "kafka_security", "choice", None, "librdkafka's `sasl.mechanism`",
             applies_to=("kafka",), choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
             default_note="none; `PLAIN` with sasl_username"),
    TableKey("sasl_username", "kafka_security", "text", None, "the SASL user (with sasl_password_env)",
             applies_to=("kafka",)),
    TableKey("sasl_password_env", "kafka_security", "variable name", None, "the variable holding the SASL "
             "password (with sasl_username)", applies_to=("kafka",)),
    # Retries and the destination's health.
    TableKey("preset", "retry", "choice", '"generic"', "the retry preset (a wing may add its own)",
             choices=("generic", "memory")),
    TableKey("base", "retry", "duration", '"1s"', "the first retry's backoff, doubling after",
             default_note="the preset's; generic's shown"),
    TableKey("max_backoff", "retry", "duration", '"60s"', "the longest backoff",
             default_note="the preset's; generic's shown"),
    TableKey("max_attempts", "retry", "whole number", "25", "attempts before a message goes dead",
             default_from="OUTBOX_RELAY_MAX_ATTEMPTS", default_note="the preset's; generic's shown"),
    TableKey("jitter", "retry", "fraction", "0.1", "the random share of each backoff (0 to 1)",
             default_note="the preset's; generic's shown"),
    TableKey("max_retry_after", "retry", "duration", '"300s"', "a destination's Retry-After is believed up to "
             "this (the cap is logged)"),
    TableKey("circuit_threshold", "retry", "whole number", "10", "destination failures in a row (timeouts, 5xx, "
             "401) that open the table's circuit"),
    TableKey("probe_interval", "retry", "duration", '"10s"', "while the circuit is open: one probe message this "
             "often, no attempt spent"),
    # How the table is relayed.
    TableKey("mode", "relay", "choice", '"single-active"', "`single-active`: one relay at a time holds the table; "
             "`competing`: any number", choices=("competing", "single-active")),
    TableKey("ordering", "relay", "choice", '"park"', "a dead message with an ordering key: the key's later "
             "messages wait until it is replayed or skipped (`park`), or go on (`skip`)", choices=("park", "skip")),
    TableKey("claim", "relay", "choice", '"auto"', "how a relay holds a batch: in a transaction while its "
             "dispatch is quick, its lease written once it takes longer than `hold` (`auto`); always a committed "
             "lease (`lease`); or one open transaction from claim to settle (`transaction`)",
             choices=("auto", "lease", "transaction")),
    TableKey("hold", "relay", "duration", '"1s"', "`claim = \"auto\"`: a batch still in dispatch after this long "
             "has its lease written and its transaction committed"),
    TableKey("audit", "relay", "choice", '"all"', "the audit trail keeps every transition, or leaves out claims "
             "and deliveries (`failures`)", choices=("all", "failures")),
    TableKey("on_success", "relay", "choice", '"mark_sent"', "a delivered row is kept as sent (cleaned later) "
             "or deleted", choices=("mark_sent", "delete")),
    TableKey("group", "relay", "name", '"default"', "the relay group: one run (or `relay --group`) relays every "
             "table of its group (lowercase letters, digits, _)"),
    TableKey("dedup", "relay", "true/false", "false", "ack a message whose (topic, payload_sha) was already sent"),
    TableKey("batch_size", "relay", "whole number", "100", "messages per claim", default_from="OUTBOX_BATCH_SIZE"),
    TableKey("batch_bytes", "relay", "whole number", "16777216", "a claim's byte budget: its messages' payloads and "
             "headers (JSON text) fit in it, or it holds one message alone", default_from="OUTBOX_BATCH_BYTES"),
    TableKey("lease", "relay", "duration", '"60s"', "the claim's lease, renewed during long deliveries",
             default_from="OUTBOX_RELAY_LOCK_TTL"),
    TableKey("stuck_threshold", "relay", "duration", '"10m"', "a `sending` row unchanged this long is stuck, and "
             "requeued", default_from="OUTBOX_STUCK_THRESHOLD_MIN"),
    TableKey("paused_topics", "relay", "list of text", "[]", "topics not claimed for now (they wait as pending)"),
    TableKey("relay_enabled", "relay", "true/false", "true", "the table is relayed",
             default_from="OUTBOX_RELAY_ENABLED"),
    # The cleaner.
    TableKey("retention", "cleaner", "duration", '"168h"', "sent rows are kept this long",
             default_from="OUTBOX_CLEANER_RETENTION"),
    TableKey("cleaner_enabled", "cleaner", "true/false", "true", "the cleaner cleans the table",
             default_from="OUTBOX_CLEANER_ENABLED"),
    # When the table's asset checks (and their alerts) turn WARN or ERROR.
    *_thresholds("lag_p95", "duration", '"60s"', '"300s"', "p95 wait of the messages due and not yet delivered"),
    *_thresholds("oldest_pending", "duration", '"300s"', '"30m"', "the oldest message due and not yet delivered"),
    *_thresholds("dead", "count", "1", "100", "dead messages"),
    *_thresholds("stuck", "count", "1", "50", "messages stuck in sending"),
    *_thresholds("backlog", "count", "10000", "100000", "messages waiting (pending and retrying)"),
    *_thresholds("destination_failing", "duration", '"30s"', '"5m"', "how long every delivery has failed"),
    *_thresholds("blocked_keys", "count", "1", "10", "ordering keys held back by a dead message (`park`)"),
    *_thresholds("vacuum_held", "duration", '"10m"', '"1h"', "how long a transaction, prepared transaction or "
                 "replication slot has held vacuum back while the table has `dead_tuples_warn` dead tuples"),
    TableKey("dead_tuples_warn", "checks", "count", "100000", "dead tuples (row versions vacuum has not removed "
             "yet, not dead messages) below which the vacuum check stays OK"),
    TableKey("dead_tuples_ratio_warn", "checks", "fraction", "0.2", "dead tuples per live row at which the vacuum "
             "check turns WARN when nothing holds vacuum back (autovacuum falling behind)"),
)
# fmt: on

TABLE_KEYS_BY_NAME = {key.name: key for key in TABLE_KEY_REGISTRY}
# The keys a section may carry: a key is accepted only if it is documented here.
TABLE_KEYS = frozenset(TABLE_KEYS_BY_NAME)


def choices(name: str) -> tuple[str, ...]:
    """The words the key ``name`` accepts."""
    return TABLE_KEYS_BY_NAME[name].choices


def keys_in(group: str) -> tuple[TableKey, ...]:
    """The keys of one group, in the registry's order."""
    return tuple(key for key in TABLE_KEY_REGISTRY if key.group == group)
