"""How one written value is read: a duration, one word of a few, a positive or a whole number, an operator's text.

Each reader raises ConfigError naming where the value was written (``what``) and what to write instead. One rule
for files, environment, command line and Dagster's launches: a duration finite, 0 to ``MAX_DURATION_S`` (100
years); a whole number fits PostgreSQL's integer (``MAX_WHOLE``); an operator's text one printable line.
"""

import math
import re
from collections.abc import Iterable
from typing import Any

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import unprintable_problem

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

# The longest duration anything takes: 100 years. Past it a time ago is before any row, a retention keeps
# forever, and a deadline or a sleep overflows (a datetime, a thread's timeout, PostgreSQL's interval).
MAX_DURATION_S = 36500 * 86400.0
MAX_DURATION_TEXT = "36500d (100 years)"
# A whole number (a batch size, attempts, threads) goes to PostgreSQL as an integer; a count as a bigint.
MAX_WHOLE = 2**31 - 1
MAX_COUNT = 2**63 - 1
# An operator's free text (a skip's reason), as it is kept in the audit.
MAX_TEXT_CHARS = 1000


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_seconds(seconds: float, what: str, given: Any = None) -> float:
    """``seconds``, or ConfigError when it is not a number of seconds from 0 to MAX_DURATION_S."""
    shown = given if given is not None else seconds
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(f"{what}: {shown!r} is not a duration; write one from 0 up to {MAX_DURATION_TEXT}")
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"{what}: {shown!r} is longer than {MAX_DURATION_TEXT}, the longest duration taken")
    return seconds


def parse_duration(value: str | float | int, what: str) -> float:
    """Seconds from '500ms', '60s', '10m', '168h', '7d' or a plain number of seconds, from 0 to 100 years."""
    if _number(value):
        return check_seconds(float(value), what)
    match = _DURATION.match(str(value))
    if not match:
        raise ConfigError(f"{what}: cannot read duration {value!r}; write it like 500ms, 60s, 10m, 168h or 7d")
    return check_seconds(float(match.group(1)) * _UNITS[match.group(2)], what, value)


def one_of(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def positive(value: float, what: str) -> float:
    if value <= 0:
        raise ConfigError(f"{what} must be more than 0, got {value}")
    return value


def whole(value: Any, what: str, minimum: int = 1, maximum: int = MAX_WHOLE) -> int:
    """``value`` when it is a whole number from ``minimum`` to ``maximum``; else ConfigError saying so."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError(f"{what} must be a whole number from {minimum} to {maximum}, got {value!r}")
    return value


def free_text(value: Any, what: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """An operator's free text (a skip's reason) as it is stored: one line of printable text. A control
    character (a newline, a terminal escape, NUL) is refused, never stripped: what is kept is what was read."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be text, got {type(value).__name__}")
    problem = unprintable_problem(value)
    if problem is not None:
        raise ConfigError(
            f"{what} contains {problem}: write one line of printable text (no newline, tab or terminal escape)"
        )
    if len(value) > max_chars:
        raise ConfigError(f"{what} holds {len(value)} characters; at most {max_chars} are kept")
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each kind of key (core/settings/registry/table_keys.py KINDS) takes, and how to say so; then the bounds
# a value of that type must be within (None: any), and how to say those.
_KIND_CHECKS: dict[str, tuple[Any, str]] = {
    "whole number": (_whole, "a whole number, like 25"),
    "count": (_whole, "a whole number, like 10"),
    "fraction": (_number, "a number, like 0.1"),
    "duration": (lambda v: _number(v) or isinstance(v, str), 'a duration, like "5s", "10m" or "168h"'),
    "true/false": (lambda v: isinstance(v, bool), "true or false"),
    "list of text": (
        lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
        'a list of text, like ["a"]',
    ),
}
_KIND_BOUNDS: dict[str, tuple[Any, str]] = {
    "whole number": (lambda v: 1 <= v <= MAX_WHOLE, f"a whole number from 1 to {MAX_WHOLE}"),
    "count": (lambda v: 0 <= v <= MAX_COUNT, f"a whole number from 0 to {MAX_COUNT}"),
    "fraction": (lambda v: math.isfinite(v) and v >= 0, "a finite number from 0"),
    "duration": (
        lambda v: isinstance(v, str) or (math.isfinite(v) and 0 <= v <= MAX_DURATION_S),
        f"a duration from 0 to {MAX_DURATION_TEXT}",
    ),
}


def check_kind(value: Any, kind: str, what: str) -> None:
    """ConfigError when ``value`` is not of the key's kind, naming the key and what it takes (YAML and TOML
    alike), before any rule reads it: a wrong type or a value out of bounds never ends in a traceback."""
    test, expected = _KIND_CHECKS.get(kind, (lambda v: isinstance(v, str), "text, in quotes"))
    if not test(value):
        raise ConfigError(f"{what} must be {expected}; got {value!r} ({type(value).__name__})")
    within, bounds = _KIND_BOUNDS.get(kind, (lambda v: True, ""))
    if not within(value):
        raise ConfigError(f"{what} must be {bounds}; got {value!r}")
    if kind == "duration" and isinstance(value, str):
        parse_duration(value, what)


def did_you_mean(unknown: Iterable[object], known: Iterable[str]) -> str:
    """`` ('max_attemps': did you mean 'max_attempts'?)`` for the unknown keys close to a known one; '' if none
    is. A YAML section may hold keys that are not text (1:, yes:): nothing to guess for those."""
    import difflib  # a mistake's path only: not imported by every start

    words = sorted(key for key in unknown if isinstance(key, str))
    choices = list(known)
    guesses = {key: difflib.get_close_matches(key, choices, n=1, cutoff=0.75) for key in words}
    close = [f"{key!r}: did you mean {match[0]!r}?" for key, match in guesses.items() if match]
    return f" ({'; '.join(close)})" if close else ""
