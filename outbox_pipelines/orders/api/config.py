"""The Order API's settings, read from the environment and checked before anything listens.

``ApiSettings.from_env`` reads OUTBOX_API_* and OUTBOX_TRUSTED_PROXIES: the bearer tokens and the
per-caller scope secret, the rate and body limits, the failed-authentication limit, whether /metrics
needs a token, and the database budget and pool of a request. Every refusal is a ConfigError that
names the variable.
"""

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import env_bool, env_int, parse_duration
from outbox_pipelines.orders import ORDERS_TABLE
from outbox_pipelines.orders.api.auth import validate_secret


@dataclass
class ApiSettings:
    database_url: str = field(repr=False)
    # The bearer tokens the API accepts (OUTBOX_API_TOKEN); only ever compared, never sent anywhere.
    tokens: tuple[str, ...] = field(default=(), repr=False)
    rate_per_minute: int = 60
    max_body_bytes: int = 16 * 1024
    trusted_proxies: tuple[str, ...] = ()
    watch_tables: Sequence[str] = field(default_factory=lambda: (ORDERS_TABLE,))
    # A request's database work (pool wait + transaction) is bounded by db_timeout_s: past it,
    # 503 DATABASE_BUSY with Retry-After. The pool waits at most pool_timeout_s of it.
    db_timeout_s: float = 2.0
    pool_size: int = 8
    pool_max_overflow: int = 8
    pool_timeout_s: float = 2.0
    # The key of the per-caller scope HMAC (OUTBOX_API_SCOPE_SECRET); None: one random secret per
    # database, in outbox_api_secret.
    scope_secret: str | None = field(default=None, repr=False)
    # Failed authentications per client address and minute before 429 (OUTBOX_API_AUTH_FAILURES_PER_MINUTE).
    auth_failures_per_minute: int = 10
    # /metrics needs the bearer token (OUTBOX_API_METRICS_REQUIRE_TOKEN); None: when tokens are set.
    metrics_require_token: bool | None = None

    def __post_init__(self) -> None:
        self.scope_secret = validate_secret(self.scope_secret)
        if self.auth_failures_per_minute < 1:
            raise ConfigError("OUTBOX_API_AUTH_FAILURES_PER_MINUTE must be at least 1")
        if self.metrics_require_token and not self.tokens:
            raise ConfigError(
                "OUTBOX_API_METRICS_REQUIRE_TOKEN=true needs OUTBOX_API_TOKEN (the tokens /metrics accepts)"
            )
        if not self.db_timeout_s > 0 or not self.pool_timeout_s > 0:
            raise ConfigError("OUTBOX_API_DB_TIMEOUT and OUTBOX_API_POOL_TIMEOUT must be over 0 (e.g. 2s, 500ms)")
        if self.pool_size < 1 or self.pool_max_overflow < 0:
            raise ConfigError("OUTBOX_API_POOL_SIZE must be at least 1 and OUTBOX_API_POOL_MAX_OVERFLOW at least 0")

    @property
    def metrics_protected(self) -> bool:
        return bool(self.tokens) if self.metrics_require_token is None else self.metrics_require_token

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.db_timeout_s))

    @classmethod
    def from_env(cls, database_url: str) -> "ApiSettings":
        tokens = tuple(t.strip() for t in (os.environ.get("OUTBOX_API_TOKEN") or "").split(",") if t.strip())
        proxies = tuple(p.strip() for p in (os.environ.get("OUTBOX_TRUSTED_PROXIES") or "").split(",") if p.strip())
        return cls(
            database_url=database_url,
            tokens=tokens,
            rate_per_minute=env_int(os.environ, "OUTBOX_API_RATE_PER_MINUTE", 60),
            max_body_bytes=env_int(os.environ, "OUTBOX_API_MAX_BODY_BYTES", 16 * 1024),
            trusted_proxies=proxies,
            db_timeout_s=parse_duration(os.environ.get("OUTBOX_API_DB_TIMEOUT") or "2s", "OUTBOX_API_DB_TIMEOUT"),
            pool_size=env_int(os.environ, "OUTBOX_API_POOL_SIZE", 8, minimum=0),
            pool_max_overflow=env_int(os.environ, "OUTBOX_API_POOL_MAX_OVERFLOW", 8, minimum=0),
            pool_timeout_s=parse_duration(os.environ.get("OUTBOX_API_POOL_TIMEOUT") or "2s", "OUTBOX_API_POOL_TIMEOUT"),
            scope_secret=os.environ.get("OUTBOX_API_SCOPE_SECRET") or None,
            auth_failures_per_minute=env_int(os.environ, "OUTBOX_API_AUTH_FAILURES_PER_MINUTE", 10, minimum=0),
            metrics_require_token=env_bool(os.environ, "OUTBOX_API_METRICS_REQUIRE_TOKEN", None),
        )
