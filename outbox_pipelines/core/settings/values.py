"""How one written value is read: a duration, one word of a few, a positive or a whole number.

Each reader raises ConfigError naming where the value was written (``what``: "[tables.NAME] lease",
"OUTBOX_RELAY_LOCK_TTL") and what to write instead.
"""

import re
from typing import Any

from outbox_pipelines.core.errors import ConfigError

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


def one_of(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def positive(value: float, what: str) -> float:
    if value <= 0:
        raise ConfigError(f"{what} must be more than 0, got {value}")
    return value


def whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be a whole number >= 1, got {value!r}")
    return value
