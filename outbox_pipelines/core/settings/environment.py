"""The seeds' environment variables, read once into ``GlobalSettings``, and the readers of one variable.

Every variable is listed, with its default and meaning, in the registry (registry/variables.py); a table's
section overrides the ones a key names there.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import overload

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings.values import MAX_DURATION_S, MAX_WHOLE, parse_duration

BROKER_TOKEN_ENV = "OUTBOX_BROKER_TOKEN"
# A bearer token travels in a header: printable ASCII without spaces.
_TOKEN = re.compile(r"^[\x21-\x7e]+$")


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else None


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 1, maximum: int = MAX_WHOLE) -> int:
    """A whole-number variable (unset or empty: ``default``), or ConfigError saying what is wrong."""
    raw = _env(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name}={value} must be a whole number from {minimum} to {maximum}")
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


def bearer_token(env: Mapping[str, str], name: str) -> str | None:
    """A bearer token from the variable ``name``, refused at start-up when it could not travel in a header
    (never shown)."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    token = raw.strip()
    if not _TOKEN.fullmatch(token):
        raise ConfigError(
            f"{name} holds spaces, control or non-ASCII characters: it cannot be sent as "
            "'Authorization: Bearer <token>'; set the token alone"
        )
    return token


@dataclass(frozen=True)
class GlobalSettings:
    """The seeds' environment variables (docs/reference/configuration.md) with their defaults."""

    batch_size: int = 100
    # OUTBOX_BATCH_BYTES: a claim's byte budget, unless a table's section sets ``batch_bytes`` (16 MiB).
    batch_bytes: int = 16 * 1024 * 1024
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
    # Dead rows and audit rows are kept this long (docs/how-to/retention.md); the tables' autovacuum settings.
    cleaner_dead_retention_s: float = 30 * 86400.0
    audit_retention_s: float = 30 * 86400.0
    autovacuum: str = "default"
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
            batch_bytes=env_int(env, "OUTBOX_BATCH_BYTES", 16 * 1024 * 1024),
            handler_threads=env_int(env, "OUTBOX_PARALLELISM", 4),
            retry_max=env_int(env, "OUTBOX_RETRY_MAX", 8) if retry_max else None,
            idle_sleep_s=env_int(env, "OUTBOX_IDLE_SLEEP_MS", 200, minimum=1) / 1000.0,
            stuck_threshold_s=env_int(env, "OUTBOX_STUCK_THRESHOLD_MIN", 10, maximum=int(MAX_DURATION_S // 60)) * 60.0,
            relay_enabled=env_bool(env, "OUTBOX_RELAY_ENABLED", True),
            poll_interval_s=parse_duration(
                _env(env, "OUTBOX_RELAY_POLL_INTERVAL") or "1s", "OUTBOX_RELAY_POLL_INTERVAL"
            ),
            lock_ttl_s=parse_duration(_env(env, "OUTBOX_RELAY_LOCK_TTL") or "60s", "OUTBOX_RELAY_LOCK_TTL"),
            relay_max_attempts=env_int(env, "OUTBOX_RELAY_MAX_ATTEMPTS", 25) if relay_max else None,
            cleaner_enabled=env_bool(env, "OUTBOX_CLEANER_ENABLED", True),
            cleaner_retention_s=parse_duration(
                _env(env, "OUTBOX_CLEANER_RETENTION") or "168h", "OUTBOX_CLEANER_RETENTION"
            ),
            cleaner_dead_retention_s=parse_duration(
                _env(env, "OUTBOX_CLEANER_DEAD_RETENTION") or "30d", "OUTBOX_CLEANER_DEAD_RETENTION"
            ),
            audit_retention_s=parse_duration(_env(env, "OUTBOX_AUDIT_RETENTION") or "30d", "OUTBOX_AUDIT_RETENTION"),
            autovacuum=_env(env, "OUTBOX_AUTOVACUUM") or "default",
            broker_url=_env(env, "OUTBOX_BROKER_URL"),
            broker_token=bearer_token(env, BROKER_TOKEN_ENV),
            environ=env,
        )
