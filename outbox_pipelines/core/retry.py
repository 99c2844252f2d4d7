"""Backoff and retry horizons (docs/explanation/outcomes.md, "Backoff and retry horizons")."""

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from outbox_pipelines.core import wings
from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.errors import ConfigError

# Receives (low, high) and returns a number in that range; tests inject their own.
UniformSource = Callable[[float, float], float]

IDEMPOTENCY_WINDOW_S = 48 * 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float
    max_s: float
    max_attempts: int
    jitter: float

    def validate(self) -> "RetryPolicy":
        if self.base_s <= 0 or self.max_s < self.base_s:
            raise ConfigError(f"backoff needs 0 < base ({self.base_s}) <= max ({self.max_s})")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"jitter must be in [0, 1), got {self.jitter}")
        return self

    def delay_s(self, attempts: int, uniform: UniformSource = random.uniform) -> float:
        """Delay before the next try after failed attempt number ``attempts`` (1-based)."""
        exponent = max(attempts - 1, 0)
        # Cap the exponent first: 2**1000 is fine for ints but not for floats.
        raw = self.base_s * (2.0 ** min(exponent, 62))
        bounded = min(raw, self.max_s)
        return max(0.0, bounded * (1.0 + uniform(-self.jitter, self.jitter)))

    def horizon_s(self) -> float:
        """The longest time from the first attempt to giving up, jitter included."""
        return sum(min(self.base_s * 2.0 ** min(n - 1, 62), self.max_s) for n in range(1, self.max_attempts)) * (
            1.0 + self.jitter
        )

    def check_inside_window(self, window_s: float = IDEMPOTENCY_WINDOW_S, table_name: str = "") -> None:
        horizon = self.horizon_s()
        if horizon >= window_s * 0.5:
            raise ConfigError(
                f"{table_name or 'table'}: retries may go on for {duration_words(horizon)}, which is not well inside "
                f"the destination's idempotency window of {duration_words(window_s)}; a late retry could run twice. "
                "Lower max_attempts or max backoff."
            )

    def with_overrides(self, **overrides: float | int | None) -> "RetryPolicy":
        # Any: each key is a field of its own type (replace checks the names at run time).
        chosen: dict[str, Any] = {key: value for key, value in overrides.items() if value is not None}
        return replace(self, **chosen).validate()


# The engine's presets; a wing adds its own (core/wings.py), and ``preset`` finds both.
PRESETS: dict[str, RetryPolicy] = {
    # seed 003: base 60 s, max 3600 s, jitter 0.3
    "memory": RetryPolicy(base_s=60.0, max_s=3600.0, max_attempts=10, jitter=0.3),
    # seed 004: min(1 s * 2^(n-1), 60 s), 25 attempts
    "generic": RetryPolicy(base_s=1.0, max_s=60.0, max_attempts=25, jitter=0.1),
}


def all_presets() -> dict[str, RetryPolicy]:
    """The engine's presets and the wings'."""
    return {**wings.retry_presets(), **PRESETS}


def preset(name: str) -> RetryPolicy:
    presets = all_presets()
    try:
        return presets[name]
    except KeyError:
        raise ConfigError(f"unknown retry preset {name!r}; choose one of {', '.join(sorted(presets))}") from None
