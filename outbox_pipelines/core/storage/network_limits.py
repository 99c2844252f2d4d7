"""What bounds a connection's waits on the network: a connect timeout, TCP keepalives and a TCP user timeout.

Every connection the package opens gets them unless its URL sets them itself (the URL wins); none cuts a long
statement on a healthy server (``statement_timeout`` does). Each limit: docs/explanation/storage.md,
"Network limits".
"""

import os
from collections.abc import Mapping
from typing import Any

import psycopg

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage.database_url import psycopg_url

# name of the libpq parameter -> (environment variable, default, minimum)
LIMITS: dict[str, tuple[str, int, int]] = {
    "connect_timeout": ("OUTBOX_DB_CONNECT_TIMEOUT_S", 10, 1),
    "keepalives_idle": ("OUTBOX_DB_KEEPALIVES_IDLE_S", 30, 1),
    "keepalives_interval": ("OUTBOX_DB_KEEPALIVES_INTERVAL_S", 10, 1),
    "keepalives_count": ("OUTBOX_DB_KEEPALIVES_COUNT", 3, 1),
    "tcp_user_timeout": ("OUTBOX_DB_TCP_USER_TIMEOUT_MS", 60_000, 1),
}
# libpq's own variable for the connect timeout: when set, it is the user's choice, as a URL's would be.
_LIBPQ_CONNECT_TIMEOUT_ENV = "PGCONNECT_TIMEOUT"


def limits(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """The libpq parameters the environment gives (their defaults when unset), or ConfigError naming a bad one."""
    env = os.environ if env is None else env
    chosen = {"keepalives": 1}
    for parameter, (name, default, minimum) in LIMITS.items():
        raw = (env.get(name) or "").strip()
        if not raw:
            chosen[parameter] = default
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a whole number") from None
        if value < minimum:
            raise ConfigError(f"{name}={value} must be at least {minimum}")
        chosen[parameter] = value
    return chosen


def params(url: str, given: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The keyword arguments of a connection to ``url``: ``given``, plus each limit neither it nor the URL sets."""
    given = dict(given or {})
    env = os.environ if env is None else env
    try:
        in_url = psycopg.conninfo.conninfo_to_dict(psycopg_url(url))
    except psycopg.Error:
        return given  # a URL libpq cannot read: the connect says so, with its own words
    if env.get(_LIBPQ_CONNECT_TIMEOUT_ENV):
        in_url.setdefault("connect_timeout", env[_LIBPQ_CONNECT_TIMEOUT_ENV])
    added = {name: value for name, value in limits(env).items() if name not in in_url and name not in given}
    return {**added, **given}
