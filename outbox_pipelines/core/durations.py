"""How a duration is shown to a person, in one function: ``duration_words`` (alerts, checks, the CLI, the on-call
page, run descriptions). A duration is read from text by ``core/settings/values.py`` (``parse_duration``)."""

import math

# How a duration is worded wherever one is shown (alerts, checks, the CLI, the on-call page, reports): the unit
# and the longest value it is used up to. A test holds that no other module turns seconds into words.
_WORDED_UNITS = (("s", 1.0, 120.0), ("min", 60.0, 7200.0), ("h", 3600.0, 172800.0), ("d", 86400.0, math.inf))


def duration_words(seconds: float | None) -> str:
    """``seconds`` as shown to a person: '250 ms', '4.5 s', '42 s', '3 min', '2.5 h', '7 d' (a whole number from 10
    on, one decimal below, none when it is .0); '-' for no duration."""
    if seconds is None:
        return "-"
    if 0 < seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    unit, size, _ = next(worded for worded in _WORDED_UNITS if seconds < worded[2])
    value = seconds / size
    number = f"{value:.0f}" if value >= 10 else f"{value:.1f}".removesuffix(".0")
    return f"{number} {unit}"
