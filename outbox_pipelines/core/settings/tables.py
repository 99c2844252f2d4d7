"""A table's settings as the engine uses them (``TableSettings``, ``CheckThresholds``), the words its keys
accept, and the engine's shipped tables.

Each key's default, as a user writes it, and its meaning are in the registry (registry/table_keys.py); the
words a choice accepts are read from there.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from outbox_pipelines.core import wings
from outbox_pipelines.core.retry import RetryPolicy, preset
from outbox_pipelines.core.settings.already_processed import STRICT_ALREADY_PROCESSED, AlreadyProcessed
from outbox_pipelines.core.settings.brokers import BROKERS, BrokerSettings
from outbox_pipelines.core.settings.registry import choices, keys_in
from outbox_pipelines.core.storage.table_claims import DEFAULT_BATCH_BYTES

DESTINATION_KINDS = ("http", "handlers", "paper", *BROKERS)
# Destinations that take a URL (its credentials are checked at start-up): HTTP, and those a wing says do.
URL_DESTINATIONS = ("http",)


def destination_kinds() -> tuple[str, ...]:
    """Every ``destination`` a table may name: the engine's and the wings' (core/wings.py)."""
    return (*DESTINATION_KINDS, *wings.destinations())


def url_destinations() -> tuple[str, ...]:
    return (*URL_DESTINATIONS, *wings.url_destinations())


MODES = choices("mode")
SUCCESS_POLICIES = choices("on_success")
# What a dead message with an ordering key does to its key's later messages
# (docs/explanation/ordering-keys.md, "A dead head parks its key").
ORDERING_POLICIES = choices("ordering")
# How a relay holds a claimed batch (docs/explanation/relay.md, "Claim modes").
CLAIM_MODES = choices("claim")
# What the audit trail keeps.
AUDIT_MODES = choices("audit")
# The relay group a table joins unless its section names one: one Dagster run hosts a group's tables.
DEFAULT_GROUP = "default"


@dataclass(frozen=True)
class CheckThresholds:
    """When a table's asset checks turn WARN or ERROR."""

    lag_p95_warn_s: float = 60.0
    lag_p95_error_s: float = 300.0
    oldest_pending_warn_s: float = 300.0
    oldest_pending_error_s: float = 1800.0
    dead_warn: int = 1
    dead_error: int = 100
    stuck_warn: int = 1
    stuck_error: int = 50
    backlog_warn: int = 10_000
    backlog_error: int = 100_000
    # How long the destination may fail (nothing delivered) before the destination check turns WARN / ERROR.
    destination_failing_warn_s: float = 30.0
    destination_failing_error_s: float = 300.0
    # Keys whose head is dead and parked (ordering = "park"): their later messages wait for an operator.
    blocked_keys_warn: int = 1
    blocked_keys_error: int = 10
    # The vacuum check (core/oncall/database_health.py): how long something may hold vacuum back while the table
    # has dead_tuples_warn dead tuples, and the dead tuples per live row at which vacuum is falling behind.
    vacuum_held_warn_s: float = 600.0
    vacuum_held_error_s: float = 3600.0
    dead_tuples_warn: int = 100_000
    dead_tuples_ratio_warn: float = 0.2


# A threshold key -> the CheckThresholds field it sets (a duration's in seconds: ``_s``), and its kind.
THRESHOLD_KEYS = {
    key.name: (f"{key.name}_s" if key.kind == "duration" else key.name, key.kind) for key in keys_in("checks")
}


@dataclass(frozen=True)
class TableSettings:
    name: str
    destination: str = "paper"
    url: str | None = None
    # The bearer token sent to ``url`` (token_env, or OUTBOX_BROKER_TOKEN at the broker's origin); never shown.
    token: str | None = field(default=None, repr=False)
    # What a 409's body must say to count as delivered (``already_processed``; strict by default).
    already_processed: AlreadyProcessed = STRICT_ALREADY_PROCESSED
    # Set when messages go nowhere (the paper broker): the sentence that relay starts, the destination check
    # and ``status`` say.
    delivers_nowhere: str | None = None
    # Set (MissingSecret's message) when a variable the destination's credential comes from is not set in this
    # process: the table was read for the commands that do not deliver (Settings.for_operations), and no
    # destination is built for it (core/destinations/wiring.py).
    secrets_missing: str | None = None
    # A broker table's connection (destination = "nats" | "rabbitmq" | "kafka"); None for the others.
    broker: BrokerSettings | None = None
    # An HTTP table's Standard Webhooks signing secret (``signing_secret_env``); never shown.
    signing_secret: str | None = field(default=None, repr=False)
    handlers: str | None = None
    timeout_s: float = 5.0
    transport: str = "aiohttp-native"
    preset: str = "generic"
    retry: RetryPolicy = field(default_factory=lambda: preset("generic"))
    # One active relay per table unless a table says competing
    # (docs/explanation/relay.md, "Single-active and competing").
    mode: str = "single-active"
    on_success: str = "mark_sent"
    ordering: str = "park"
    claim: str = "auto"
    audit: str = "all"
    # The relay group: one Dagster run relays every table of its group, each on a worker of its own.
    group: str = DEFAULT_GROUP
    dedup: bool = False
    batch_size: int = 100
    # A claim's byte budget: its messages' payloads and headers (JSON text) fit in it, or it holds one.
    batch_bytes: int = DEFAULT_BATCH_BYTES
    # Threads running an in-process handlers destination (the ``parallelism`` key, OUTBOX_PARALLELISM).
    handler_threads: int = 4
    # Requests in flight at once for an HTTP destination (the ``concurrency`` key).
    requests_in_flight: int = 32
    lease_s: float = 60.0
    # claim = "auto": a batch still in dispatch after this long has its lease written
    # (docs/explanation/relay.md, "Claim modes").
    hold_s: float = 1.0
    stuck_threshold_s: float = 600.0
    retention_s: float = 168 * 3600.0
    paused_topics: tuple[str, ...] = ()
    relay_enabled: bool = True
    cleaner_enabled: bool = True
    idle_sleep_s: float = 0.2
    poll_interval_s: float = 1.0
    checks: CheckThresholds = field(default_factory=CheckThresholds)
    # A Retry-After longer than this is not believed (it would stall the table); the cap is logged.
    max_retry_after_s: float = 300.0
    # This many destination failures in a row (timeouts, 5xx, 401) open the table's circuit:
    # then one probe message every probe_interval, and no attempt is spent while it stays open.
    circuit_threshold: int = 10
    probe_interval_s: float = 10.0

    @property
    def renew_every_s(self) -> float:
        """How often a relay renews the leases of the rows it holds, which also marks them as moving: a third of
        the lease, or of the stuck threshold when that is shorter, so a live relay's rows are never stuck."""
        return max(min(self.lease_s, self.stuck_threshold_s) / 3.0, 0.05)


def shipped_tables(parts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The defaults of the tables ``parts`` ship (core/wings.py); a declaration's sections override them. The
    engine ships none: a project has the tables it declares."""
    return {name: dict(section) for name, section in wings.shipped_tables(parts).items()}
