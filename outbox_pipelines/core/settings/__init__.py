"""Per-table settings from one file a user edits, plus the seeds' environment variables.

The file is TOML, found through ``OUTBOX_CONFIG`` (or ``./outbox.toml``); without
one, built-in defaults cover the three shipped tables. See outbox.example.toml.
"""

import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload
from urllib.parse import urlsplit

from outbox_pipelines.core import wings
from outbox_pipelines.core.destinations.http_outcomes import (
    DEFAULT_ALREADY_PROCESSED,
    STRICT_ALREADY_PROCESSED,
    AlreadyProcessed,
)
from outbox_pipelines.core.destinations.signing import signing_keys
from outbox_pipelines.core.errors import ConfigError, InvalidTableName, UnknownTable
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.redaction import redact_url
from outbox_pipelines.core.retry import RetryPolicy, preset
from outbox_pipelines.core.settings.brokers import (
    BROKERS,
    KAFKA_SECURITY_KEYS,
    BrokerSettings,
    broker_settings,
    env_variable,
    split_url,
)
from outbox_pipelines.core.settings.declarations import Declaration, find_declaration, load_config_file

DESTINATION_KINDS = ("http", "handlers", "paper", *BROKERS)
# Destinations that take a URL (its credentials are checked at start-up): HTTP, and those a wing says do.
URL_DESTINATIONS = ("http",)


def destination_kinds() -> tuple[str, ...]:
    """Every ``destination`` a table may name: the engine's and the wings' (core/wings.py)."""
    return (*DESTINATION_KINDS, *wings.destinations())


def url_destinations() -> tuple[str, ...]:
    return (*URL_DESTINATIONS, *wings.url_destinations())

# What a shipped table's ``url_from_env`` may name: the GlobalSettings field, and the variable it comes from.
URL_FROM_ENV = {"broker_url": "OUTBOX_BROKER_URL"}
BROKER_TOKEN_ENV = "OUTBOX_BROKER_TOKEN"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODES = ("competing", "single-active")
SUCCESS_POLICIES = ("mark_sent", "delete")
# What a dead message with an ordering key does to its key's later messages: park holds them back (the key
# is blocked until the message is replayed or skipped), skip lets them go (the dead message stays dead).
ORDERING_POLICIES = ("park", "skip")
# How a relay holds a claimed batch (docs/design.md "Claim modes"): "lease" writes the claim (status
# sending, attempt counted) and settles in a second transaction; "transaction" locks the rows in
# one open transaction that the settle commits, half the row writes, but a message that kills
# the relay process is retried without its attempt being counted.
CLAIM_MODES = ("lease", "transaction")
# What the audit trail keeps: "all" every transition; "failures" leaves out claims and
# deliveries (a sent row still says when it went), keeps retries, deaths, conflicts, re-takes.
AUDIT_MODES = ("all", "failures")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: str | float | int, what: str) -> float:
    """Seconds from '500ms', '60s', '10m', '168h', '7d' or a plain number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ConfigError(f"{what}: cannot read duration {value!r}; write it like 500ms, 60s, 10m, 168h or 7d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else None


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    """A whole-number variable (unset or empty: ``default``), or ConfigError saying what is wrong."""
    raw = _env(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


@overload
def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool: ...
@overload
def env_bool(env: Mapping[str, str], name: str, default: None) -> bool | None: ...
def env_bool(env: Mapping[str, str], name: str, default: bool | None) -> bool | None:
    """A true/false variable (unset or empty: ``default``), or ConfigError saying what is wrong."""
    raw = _env(env, name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: use true or false")


@dataclass(frozen=True)
class GlobalSettings:
    """The seeds' environment variables (docs/design.md §4.4) with their defaults."""

    batch_size: int = 100
    # OUTBOX_PARALLELISM: a handlers table's threads, unless its section sets ``parallelism``.
    handler_threads: int = 4
    retry_max: int | None = None
    idle_sleep_s: float = 0.2
    stuck_threshold_s: float = 600.0
    relay_enabled: bool = True
    poll_interval_s: float = 1.0
    lock_ttl_s: float = 60.0
    relay_max_attempts: int | None = None
    cleaner_enabled: bool = True
    cleaner_retention_s: float = 168 * 3600.0
    broker_url: str | None = None
    # OUTBOX_BROKER_TOKEN, sent as "Authorization: Bearer <token>" to the broker's origin (OUTBOX_BROKER_URL's)
    # and to tables that name it in ``token_env``; never shown.
    broker_token: str | None = field(default=None, repr=False)
    # The process environment the settings were read from: a table's ``token_env`` is looked up in it.
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "GlobalSettings":
        env = os.environ if env is None else env
        retry_max = _env(env, "OUTBOX_RETRY_MAX")
        relay_max = _env(env, "OUTBOX_RELAY_MAX_ATTEMPTS")
        return cls(
            batch_size=env_int(env, "OUTBOX_BATCH_SIZE", env_int(env, "OUTBOX_RELAY_BATCH_SIZE", 100)),
            handler_threads=env_int(env, "OUTBOX_PARALLELISM", 4),
            retry_max=env_int(env, "OUTBOX_RETRY_MAX", 8) if retry_max else None,
            idle_sleep_s=env_int(env, "OUTBOX_IDLE_SLEEP_MS", 200, minimum=1) / 1000.0,
            stuck_threshold_s=env_int(env, "OUTBOX_STUCK_THRESHOLD_MIN", 10) * 60.0,
            relay_enabled=env_bool(env, "OUTBOX_RELAY_ENABLED", True),
            poll_interval_s=parse_duration(_env(env, "OUTBOX_RELAY_POLL_INTERVAL") or "1s",
                                           "OUTBOX_RELAY_POLL_INTERVAL"),
            lock_ttl_s=parse_duration(_env(env, "OUTBOX_RELAY_LOCK_TTL") or "60s", "OUTBOX_RELAY_LOCK_TTL"),
            relay_max_attempts=env_int(env, "OUTBOX_RELAY_MAX_ATTEMPTS", 25) if relay_max else None,
            cleaner_enabled=env_bool(env, "OUTBOX_CLEANER_ENABLED", True),
            cleaner_retention_s=parse_duration(
                _env(env, "OUTBOX_CLEANER_RETENTION") or "168h", "OUTBOX_CLEANER_RETENTION"
            ),
            broker_url=_env(env, "OUTBOX_BROKER_URL"),
            broker_token=_bearer_token(env, BROKER_TOKEN_ENV),
            environ=env,
        )


_TOKEN = re.compile(r"^[\x21-\x7e]+$")


def _bearer_token(env: Mapping[str, str], name: str) -> str | None:
    """A bearer token from the variable ``name``, refused at start-up when it could not travel in a header
    (never shown)."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    token = raw.strip()
    if not _TOKEN.fullmatch(token):
        raise ConfigError(f"{name} holds spaces, control or non-ASCII characters: it cannot be sent as "
                          "'Authorization: Bearer <token>'; set the token alone")
    return token


def _same_origin(url: str, other: str | None) -> bool:
    if not other:
        return False
    try:
        a, b = urlsplit(url), urlsplit(other)
        return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)
    except ValueError:
        return False


def _table_token(section: Mapping[str, Any], url: str | None, env: GlobalSettings, where: str) -> str | None:
    """The bearer token a URL table sends: the variable its ``token_env`` names; else OUTBOX_BROKER_TOKEN when
    its URL is at the broker's origin (OUTBOX_BROKER_URL's, or the shipped orders table's own); else none. The
    broker's credential never goes to another origin unless a table names it: where it goes is the deployment's
    decision, written in the settings."""
    name = section.get("token_env")
    if name is not None:
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{where} token_env must name an environment variable (like BILLING_HOOK_TOKEN), "
                              f"got {name!r}")
        token = env.broker_token if name == BROKER_TOKEN_ENV else _bearer_token(env.environ, name)
        if token is None:
            raise ConfigError(f"{where} token_env = {name!r}, but {name} is not set: set it, or remove token_env")
        return token
    if url and (section.get("url_from_env") or _same_origin(url, env.broker_url)):
        return env.broker_token
    return None


def check_destination_credentials(what: str, url: str, env: GlobalSettings, token: str | None = None) -> None:
    """Refuse, at start-up, a destination URL that cannot be used or carries two credentials (shown without them).

    ``what`` names where the URL came from ("OUTBOX_BROKER_URL", "[tables.NAME] url").
    """
    shown = redact_url(url)
    parts = split_url(url, what)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} = {shown!r} must be an http:// or https:// URL with a host")
    if "@" in parts.netloc and token:
        raise ConfigError(
            f"{what} = {shown} carries user:password and a bearer token is set for it too (OUTBOX_BROKER_TOKEN, or "
            "the table's token_env): a request carries one credential. Keep the user-info (sent as Basic auth) and "
            "unset the token, or remove the user-info from the URL (the token is sent as a bearer)"
        )


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


THRESHOLD_KEYS = {
    "lag_p95_warn": ("lag_p95_warn_s", "duration"), "lag_p95_error": ("lag_p95_error_s", "duration"),
    "oldest_pending_warn": ("oldest_pending_warn_s", "duration"),
    "oldest_pending_error": ("oldest_pending_error_s", "duration"),
    "dead_warn": ("dead_warn", "count"), "dead_error": ("dead_error", "count"),
    "stuck_warn": ("stuck_warn", "count"), "stuck_error": ("stuck_error", "count"),
    "backlog_warn": ("backlog_warn", "count"), "backlog_error": ("backlog_error", "count"),
    "destination_failing_warn": ("destination_failing_warn_s", "duration"),
    "destination_failing_error": ("destination_failing_error_s", "duration"),
    "blocked_keys_warn": ("blocked_keys_warn", "count"), "blocked_keys_error": ("blocked_keys_error", "count"),
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
    # A broker table's connection (destination = "nats" | "rabbitmq" | "kafka"); None for the others.
    broker: BrokerSettings | None = None
    # An HTTP table's Standard Webhooks signing secret (``signing_secret_env``); never shown.
    signing_secret: str | None = field(default=None, repr=False)
    handlers: str | None = None
    timeout_s: float = 5.0
    transport: str = "aiohttp-native"
    preset: str = "generic"
    retry: RetryPolicy = field(default_factory=lambda: preset("generic"))
    # Seed 004 / docs/design.md §2: one active relay per table unless a table says competing.
    mode: str = "single-active"
    on_success: str = "mark_sent"
    ordering: str = "park"
    claim: str = "lease"
    audit: str = "all"
    # The relay group: one Dagster run relays every table of its group, each on a worker of its own.
    group: str = "default"
    dedup: bool = False
    batch_size: int = 100
    # Threads running an in-process handlers destination (the ``parallelism`` key, OUTBOX_PARALLELISM).
    handler_threads: int = 4
    # Requests in flight at once for an HTTP destination (the ``concurrency`` key).
    requests_in_flight: int = 32
    lease_s: float = 60.0
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


# Built-in defaults of the engine's shipped tables (a wing adds its own: core/wings.py); a config file's
# sections override them.
BUILTIN_TABLES: dict[str, dict[str, Any]] = {
    # seed 003: memory writes, dedup by (topic, payload_sha)
    "outbox_memory": {"destination": "paper", "preset": "memory", "mode": "competing", "dedup": True},
}


def import_attribute(spec: str, what: str, shape: str = "package.module:attribute") -> Any:
    """What 'package.module:attribute' names (None when the module has no such attribute).

    ConfigError when ``spec`` is not of that ``shape`` or the module cannot be imported; ``what``
    says where the spec came from ("handlers", a table's destination ...).
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{what} = {spec!r}: write it as '{shape}'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} = {spec!r}: cannot import {module_name}: {exc}") from None
    return getattr(module, attribute, None)


def shipped_tables() -> dict[str, dict[str, Any]]:
    """Every shipped table's defaults: the wings' first, then the engine's own."""
    sections = {name: dict(section) for name, section in wings.shipped_tables().items()}
    sections.update(BUILTIN_TABLES)
    return sections


TABLE_KEYS = {
    "destination", "url", "handlers", "timeout", "transport", "preset", "base", "max_backoff",
    "max_attempts", "jitter", "mode", "on_success", "dedup", "batch_size", "parallelism",
    "lease", "concurrency", "stuck_threshold", "retention", "paused_topics", "relay_enabled", "cleaner_enabled",
    "max_retry_after", "circuit_threshold", "probe_interval", "claim", "audit", "already_processed", "token_env",
    "group", "ordering", "url_env", "bootstrap_servers", "topic_prefix", "exchange", "signing_secret_env",
    *KAFKA_SECURITY_KEYS,
} | set(THRESHOLD_KEYS)
# Keys a shipped table's defaults carry that a user does not write (a wing's shipped tables).
INTERNAL_KEYS = {"url_from_env"}
# The relay group a table joins unless its section names one: one Dagster run hosts a group's tables.
DEFAULT_GROUP = "default"
_GROUP = re.compile(r"^[a-z0-9_]{1,40}$")


def _check_section(name: str, section: Mapping[str, Any], source: Path | None) -> None:
    """A section's name and keys (ConfigError naming the file, the section and what to write)."""
    where = f"{source}: " if source else ""
    try:
        validate_table_name(name)
    except InvalidTableName as exc:
        raise ConfigError(f"{where}[tables.{name}]: {exc}") from None
    unknown = set(section) - TABLE_KEYS - INTERNAL_KEYS
    if unknown:
        raise ConfigError(f"{where}[tables.{name}] has unknown keys {sorted(unknown)}; "
                          f"known keys: {sorted(TABLE_KEYS)}")


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _retry_policy(section: Mapping[str, Any], env: GlobalSettings, where: str) -> tuple[str, RetryPolicy]:
    """The table's preset, with the section's overrides (and the seeds' variable for its preset's attempts)."""
    preset_name = section.get("preset", "generic")
    attempts_from = {"generic": "relay_max_attempts", **wings.preset_attempts_from()}.get(preset_name)
    env_max = getattr(env, attempts_from) if attempts_from else None
    policy = preset(preset_name).with_overrides(
        base_s=parse_duration(section["base"], f"{where} base") if "base" in section else None,
        max_s=parse_duration(section["max_backoff"], f"{where} max_backoff") if "max_backoff" in section else None,
        max_attempts=section.get("max_attempts", env_max),
        jitter=section.get("jitter"),
    )
    return preset_name, policy


@dataclass(frozen=True)
class _Where:
    """Where a table's messages go, as its section and the environment say."""

    destination: str
    url: str | None
    token: str | None
    delivers_nowhere: str | None
    broker: BrokerSettings | None = None
    signing_secret: str | None = None


def _destination(name: str, section: Mapping[str, Any], env: GlobalSettings, policy: RetryPolicy,
                 where: str) -> _Where:
    """The destination kind, URL and credential; checked here, at start-up, not at the first delivery.

    There is no implicit destination: a table names one; ``http`` needs its ``url``. The paper broker is an
    explicit choice (or the shipped orders table's while OUTBOX_BROKER_URL is unset, seed 001's default),
    and then ``delivers_nowhere`` says so wherever the table's destination is shown.
    """
    if "destination" not in section:
        raise ConfigError(f"{where} names no destination: set destination = \"http\" (with url = ...), "
                          "\"handlers\" (with handlers = \"package.module:registry\"), a broker (\"nats\", "
                          "\"rabbitmq\" with url = ..., \"kafka\" with bootstrap_servers = ...) or \"paper\" "
                          "(messages are marked sent and go nowhere)")
    destination = _one_of(section["destination"], destination_kinds(), f"{where} destination")
    url = section.get("url")
    url_source = f"{where} url"
    if "url_env" in section:
        if url is not None:
            raise ConfigError(f"{where} names both url and url_env: keep one (url_env when the URL holds a "
                              "credential, which then stays out of the file)")
        url, url_source = env_variable(section, "url_env", env.environ, where), f"{where} url_env"
    if "signing_secret_env" in section and destination != "http":
        raise ConfigError(f"{where} signing_secret_env applies to destination = \"http\" (signed webhooks)")
    if destination in BROKERS:
        broker = broker_settings(name, destination, section, url, env.environ, where)
        return _Where(destination, None, broker.token, None, broker=broker)
    broker_only = sorted({"bootstrap_servers", "topic_prefix", "exchange", *KAFKA_SECURITY_KEYS} & set(section))
    if broker_only:
        raise ConfigError(f"{where} {', '.join(broker_only)} apply to a broker destination "
                          "(\"nats\", \"rabbitmq\", \"kafka\")")
    from_env = section.get("url_from_env")
    if url is None and from_env in URL_FROM_ENV:
        # A shipped table whose URL, unless its section sets one, comes from a variable
        # (the orders table: OUTBOX_BROKER_URL; unset, its paper broker, seed 001's default).
        url, url_source = getattr(env, from_env), URL_FROM_ENV[from_env]
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError(f"{where} url must be an http:// or https:// URL, got {url!r}")
    if destination == "http" and not url:
        raise ConfigError(f"{where} destination = \"http\" has no url: set url = \"https://...\" (the endpoint "
                          "that receives the messages), or choose another destination. Nothing is delivered "
                          "anywhere until it names one.")
    if destination == "handlers":
        _check_handlers(section.get("handlers"), where)
    token = None
    if destination in url_destinations() and url:
        token = _table_token(section, url, env, where)
        check_destination_credentials(url_source, url, env, token)
        policy.check_inside_window(table_name=name)
    elif "token_env" in section:
        raise ConfigError(f"{where} token_env applies to a table with a url (destination = \"http\")")
    secret = env_variable(section, "signing_secret_env", env.environ, where)
    if secret is not None:
        try:
            signing_keys(secret)
        except ValueError as exc:
            raise ConfigError(f"{where} signing_secret_env = {section['signing_secret_env']!r}: {exc}") from None
    return _Where(destination, url, token, _nowhere(name, destination, url, from_env), signing_secret=secret)


def _check_handlers(spec: Any, where: str) -> None:
    """The handlers module imports here, at load, as it must in every process that relays the table (the
    CLI, Dagster's code server and its run workers): a mistake fails this table when the settings load,
    never as a run that fails again at every launch."""
    if not spec:
        raise ConfigError(f"{where} destination = 'handlers' needs handlers = 'package.module:registry'")
    fix = ("make the module importable in every process that runs the outbox: put it in your project's "
           "package and install the project (pip install -e .), so Dagster's code server and run workers "
           "import it without PYTHONPATH; or fix the name")
    try:
        registry = import_attribute(str(spec), f"{where} handlers", shape="package.module:registry")
    except ConfigError as exc:
        raise ConfigError(f"{exc}. To fix it, {fix}") from None
    except Exception as exc:  # noqa: BLE001 (the module's own code failed at import: say what it raised)
        raise ConfigError(f"{where} handlers = {spec!r}: importing it raised {type(exc).__name__}: {exc}") from None
    if registry is None:
        module_name, _, attribute = str(spec).partition(":")
        raise ConfigError(f"{where} handlers = {spec!r}: {module_name} has no attribute {attribute!r}; "
                          "name the HandlerRegistry it defines (package.module:registry)")


def _nowhere(name: str, destination: str, url: str | None, from_env: str | None) -> str | None:
    """The plain sentence for a table whose messages go nowhere (the paper broker), else None."""
    if destination == "paper":
        return (f"{name}: destination = \"paper\": every message is marked sent and delivered nowhere "
                "(set destination = \"http\" with a url, or \"handlers\", to deliver)")
    if destination in wings.destinations() and not url:
        variable = URL_FROM_ENV.get(from_env or "", "its url")
        return (f"{name}: {variable} is unset: the paper broker marks every message sent and delivers nothing "
                f"(set {variable} to the broker's URL to deliver)")
    return None


def _already_processed(section: Mapping[str, Any], where: str) -> AlreadyProcessed:
    rules = section.get("already_processed", DEFAULT_ALREADY_PROCESSED)
    if not isinstance(rules, (list, tuple)):
        raise ConfigError(f"{where} already_processed must be a list of rules like \"status=already_processed\" "
                          f"or a phrase, got {rules!r}")
    try:
        return AlreadyProcessed.parse(rules, f"{where} already_processed")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _thresholds(section: Mapping[str, Any], where: str) -> CheckThresholds:
    # Any: durations are floats, counts ints, each the type of its CheckThresholds field.
    thresholds: dict[str, Any] = {}
    for key, (attribute, kind) in THRESHOLD_KEYS.items():
        if key in section:
            value = parse_duration(section[key], f"{where} {key}") if kind == "duration" else section[key]
            if kind == "count" and (not isinstance(value, int) or value < 0):
                raise ConfigError(f"{where} {key} must be a whole number >= 0, got {value!r}")
            thresholds[attribute] = value
    return CheckThresholds(**thresholds)


def _paused_topics(section: Mapping[str, Any], where: str) -> tuple[str, ...]:
    paused = section.get("paused_topics", [])
    if not isinstance(paused, list) or not all(isinstance(t, str) for t in paused):
        raise ConfigError(f"{where} paused_topics must be a list of topic names")
    return tuple(paused)


def build_table_settings(name: str, section: Mapping[str, Any], env: GlobalSettings) -> TableSettings:
    where = f"[tables.{name}]"
    preset_name, policy = _retry_policy(section, env, where)
    goes = _destination(name, section, env, policy, where)
    thresholds = _thresholds(section, where)
    paused = _paused_topics(section, where)
    return TableSettings(
        name=name,
        destination=goes.destination,
        url=goes.url,
        token=goes.token,
        already_processed=_already_processed(section, where),
        delivers_nowhere=goes.delivers_nowhere,
        broker=goes.broker,
        signing_secret=goes.signing_secret,
        handlers=section.get("handlers"),
        timeout_s=parse_duration(section.get("timeout", "5s"), f"{where} timeout"),
        transport=section.get("transport", "aiohttp-native"),
        preset=preset_name,
        retry=policy,
        mode=_one_of(section.get("mode", "single-active"), MODES, f"{where} mode"),
        on_success=_one_of(section.get("on_success", "mark_sent"), SUCCESS_POLICIES, f"{where} on_success"),
        ordering=_one_of(section.get("ordering", "park"), ORDERING_POLICIES, f"{where} ordering"),
        claim=_one_of(section.get("claim", "lease"), CLAIM_MODES, f"{where} claim"),
        group=_group(section.get("group", DEFAULT_GROUP), where),
        audit=_one_of(section.get("audit", "all"), AUDIT_MODES, f"{where} audit"),
        dedup=bool(section.get("dedup", False)),
        batch_size=int(section.get("batch_size", env.batch_size)),
        handler_threads=int(section.get("parallelism", env.handler_threads)),
        requests_in_flight=int(section.get("concurrency", 32)),
        lease_s=parse_duration(section.get("lease", env.lock_ttl_s), f"{where} lease"),
        stuck_threshold_s=parse_duration(section.get("stuck_threshold", env.stuck_threshold_s),
                                         f"{where} stuck_threshold"),
        retention_s=parse_duration(section.get("retention", env.cleaner_retention_s), f"{where} retention"),
        paused_topics=paused,
        relay_enabled=bool(section.get("relay_enabled", env.relay_enabled)),
        cleaner_enabled=bool(section.get("cleaner_enabled", env.cleaner_enabled)),
        idle_sleep_s=env.idle_sleep_s,
        poll_interval_s=env.poll_interval_s,
        checks=thresholds,
        max_retry_after_s=_positive(parse_duration(section.get("max_retry_after", "300s"), f"{where} max_retry_after"),
                                    f"{where} max_retry_after"),
        circuit_threshold=_whole(section.get("circuit_threshold", 10), f"{where} circuit_threshold"),
        probe_interval_s=_positive(parse_duration(section.get("probe_interval", "10s"), f"{where} probe_interval"),
                                   f"{where} probe_interval"),
    )


def _group(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _GROUP.fullmatch(value):
        raise ConfigError(f"{where} group must be lowercase letters, digits and _ (at most 40), got {value!r}")
    return value


def _positive(value: float, what: str) -> float:
    if value <= 0:
        raise ConfigError(f"{what} must be more than 0, got {value}")
    return value


def _whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be a whole number >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    env: GlobalSettings
    tables: dict[str, TableSettings]
    source: Path | None
    # Tables whose section cannot be used, with what is wrong (ConfigError's message): the others load and
    # relay without them; every command or check that names one says why.
    broken: dict[str, str] = field(default_factory=dict)
    # The declaration as a whole cannot be read (not TOML, an unknown top-level key): no table is known. Set
    # only by ``load_settings_or_problem``, for the processes that must stay up to say so (Dagster's).
    problem: str | None = None

    def table(self, name: str) -> TableSettings:
        if name in self.broken:
            raise ConfigError(self.broken[name])
        validate_table_name(name)
        try:
            return self.tables[name]
        except KeyError:
            known = ", ".join(sorted(self.tables))
            raise UnknownTable(
                f"no settings for table {name!r}; known tables: {known}. "
                f"Add a [tables.{name}] section to {self.source or 'outbox.toml (OUTBOX_CONFIG)'}"
            ) from None

    def check(self) -> None:
        """ConfigError listing every table whose section cannot be used (the strict reading of the file)."""
        if self.problem:
            raise ConfigError(self.problem)
        if self.broken:
            raise ConfigError("; ".join(self.broken[name] for name in sorted(self.broken)))

    def groups(self) -> dict[str, list[str]]:
        """Each relay group's tables (the usable ones), by name."""
        groups: dict[str, list[str]] = {}
        for name in sorted(self.tables):
            groups.setdefault(self.tables[name].group, []).append(name)
        return groups


def load_settings(env: Mapping[str, str] | None = None, path: Path | None = None,
                  declaration: Declaration | None = None) -> Settings:
    """The settings; a table whose section cannot be used is left out and named in ``broken`` (its error), so
    one table's mistake never takes the others down. A file that is not valid TOML still raises ConfigError.

    The tables are ``declaration``'s (an ``OutboxComponent``'s), else the file's at ``path``, else
    OUTBOX_CONFIG's or the project's ``outbox.toml``; with the shipped tables unless it says otherwise."""
    global_settings = GlobalSettings.from_env(env)
    if declaration is None:
        declaration = load_config_file(path) if path is not None else find_declaration(env)
    source = declaration.source
    sections: dict[str, dict[str, Any]] = (
        {name: dict(s) for name, s in shipped_tables().items()} if declaration.shipped_tables else {})
    written = declaration.tables
    for name, section in written.items():
        sections[name] = {**sections.get(name, {}), **section}
    tables: dict[str, TableSettings] = {}
    broken: dict[str, str] = {}
    for name, section in sections.items():
        try:
            if name in written:
                _check_section(name, written[name], source)
            tables[name] = build_table_settings(name, section, global_settings)
        except ConfigError as exc:
            text = str(exc)
            broken[name] = text if source is None or text.startswith(str(source)) else f"{source}: {text}"
    return Settings(global_settings, tables, source, broken)


def load_settings_or_problem(env: Mapping[str, str] | None = None, path: Path | None = None,
                             declaration: Declaration | None = None) -> Settings:
    """``load_settings`` for a process that must stay up when the declaration cannot be read at all (Dagster's
    code location, its sensors): no table, and ``problem`` saying what to fix, for a check and an alert to tell,
    instead of a code location that fails to load and goes quiet."""
    try:
        return load_settings(env, path, declaration)
    except ConfigError as exc:
        return Settings(GlobalSettings.from_env(env), {}, path, problem=str(exc))
