"""This relay's own pause: claim nothing for a while (a 429, a circuit that says wait).

The database holds the table's pause for every other relay of it (``DestinationGuard``);
this is the relay's local copy, checked before every claim without a round trip.
"""

import time


class Pause:
    def __init__(self) -> None:
        self.until = 0.0  # time.monotonic()
        self.reason = ""

    @property
    def active(self) -> bool:
        return time.monotonic() < self.until

    def remaining(self) -> float:
        return max(self.until - time.monotonic(), 0.0)

    def hold(self, seconds: float, reason: str) -> None:
        """Claim nothing for ``seconds``; a longer pause already in place stands."""
        until = time.monotonic() + seconds
        if until > self.until:
            self.until, self.reason = until, reason

    def lift(self) -> None:
        """End the pause now (the circuit it waited on closed: a probe in flight succeeded meanwhile)."""
        self.until, self.reason = 0.0, ""
