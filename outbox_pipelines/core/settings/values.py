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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# What each kind of key (core/settings/registry/table_keys.py KINDS) takes, and how to say so.
_KIND_CHECKS: dict[str, tuple[Any, str]] = {
    "whole number": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number, like 25"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number, like 10"),
    "fraction": (_number, "a number, like 0.1"),
    "duration": (lambda v: _number(v) or isinstance(v, str), 'a duration, like "5s", "10m" or "168h"'),
    "true/false": (lambda v: isinstance(v, bool), "true or false"),
    "list of text": (
        lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
        'a list of text, like ["a"]',
    ),
}


def check_kind(value: Any, kind: str, what: str) -> None:
    """ConfigError when ``value`` is not of the key's kind, naming the key and what it takes (YAML and TOML
    alike), before any rule reads it: a wrong type never ends in a traceback."""
    test, expected = _KIND_CHECKS.get(kind, (lambda v: isinstance(v, str), "text, in quotes"))
    if not test(value):
        raise ConfigError(f"{what} must be {expected}; got {value!r} ({type(value).__name__})")
