"""A stop request (SIGTERM, Ctrl-C, Dagster's termination, a relay group letting go), and waiting on it.

A request is one plain attribute store (safe from a signal handler and any thread); a wait is a sleep cut in
slices of ``SLICE_S``. ``StopDeadline`` bounds a relay process's stop by ``OUTBOX_RELAY_STOP_TIMEOUT_S``.
Why not a ``threading.Event``: docs/explanation/relay.md, "Stopping".
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum

from outbox_pipelines.core.deadlines import exit_saying, seconds_from_env

log = logging.getLogger("outbox_pipelines.relay")

# How soon a wait notices a stop request. A stop is rare and a slice's wake-up costs microseconds.
SLICE_S = 0.1
STOP_TIMEOUT_ENV = "OUTBOX_RELAY_STOP_TIMEOUT_S"
# Under the 60 s a container gets between SIGTERM and SIGKILL (deploy/docker-compose.yaml's stop_grace_period),
# and past a batch that settles normally (a destination's timeout is 5 s by default).
DEFAULT_STOP_TIMEOUT_S = 30
EXIT_NOT_STOPPED = 1


class StopReason(StrEnum):
    """Why a relay invocation ended: its report's ``stopped_because``, as run metadata, the CLI and the relays
    table show it. Some reasons carry detail after the member's text ("stop requested; ... (left running)")."""

    STOP_REQUESTED = "stop requested"
    TIME_BUDGET = "time budget used"
    ENTRY_BUDGET = "entry budget used"
    NOTHING_READY = "nothing ready"
    DRAINED = "drained what was ready"
    LOCK_HELD_ELSEWHERE = "another relay holds the single-active lock"
    LOCK_LOST = "lost the single-active lock while reconnecting"
    UNREACHABLE_PAST_BUDGET = "time budget used while the database was unreachable"
    GAVE_WAY = "gave its place to a waiting table"
    IDLE = "idle"


class StopRequest:
    def __init__(self) -> None:
        self._requested = False

    def request(self, *_: object) -> None:
        """Ask to stop: safe from a signal handler (it takes the ``(signum, frame)`` it is called with)."""
        self._requested = True

    @property
    def requested(self) -> bool:
        return self._requested

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, ending within a slice of a stop request; whether a stop was requested."""
        deadline = time.monotonic() + max(seconds, 0.0)
        while not self._requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, SLICE_S))
        return True


def stop_timeout_s(env: Mapping[str, str] | None = None) -> int:
    """``OUTBOX_RELAY_STOP_TIMEOUT_S``: how long a relay may take to stop once asked (ConfigError when unreadable)."""
    return seconds_from_env(STOP_TIMEOUT_ENV, DEFAULT_STOP_TIMEOUT_S, env)


class StopDeadline:
    """Once ``stop`` is requested, the process ends within ``bound_s``: stopped by itself (``disarm``), or else
    by a thread of its own, which logs one sentence (``what`` stopped too slowly: a name, or a function that
    tells it then) and exits the process with ``EXIT_NOT_STOPPED``.

    The thread only reads the request (an attribute) and sleeps: it needs nothing the stuck call may hold.
    Armed by a process's entry point only (the CLI's relay): a library's caller keeps its process.
    """

    def __init__(
        self,
        stop: StopRequest,
        what: str | Callable[[], str],
        bound_s: float | None = None,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.stop, self.what = stop, what
        self.bound_s = float(stop_timeout_s() if bound_s is None else bound_s)
        self._exit = exit
        self._done = False

    def arm(self, budget_s: float | None = None) -> "StopDeadline":
        """Watch from now on; ``budget_s``: the run's time budget, whose end counts as a stop request."""
        ends = None if budget_s is None else time.monotonic() + budget_s
        threading.Thread(target=self._watch, args=(ends,), daemon=True, name="outbox-stop-deadline").start()
        return self

    def disarm(self) -> None:
        self._done = True

    def _watch(self, budget_ends: float | None) -> None:
        while not (self._done or self.stop.requested or (budget_ends is not None and time.monotonic() >= budget_ends)):
            time.sleep(SLICE_S)
        if self._done:
            return
        cause = "the stop request" if self.stop.requested else "the end of its time budget"
        deadline = time.monotonic() + self.bound_s
        while not self._done:
            if time.monotonic() >= deadline:
                what = self.what if isinstance(self.what, str) else self.what()
                sentence = (
                    f"{what} did not stop within {self.bound_s:g}s of {cause} (a database or destination call that "
                    "does not return, such as a network partition); exiting now with code "
                    f"{EXIT_NOT_STOPPED}. The rows it held go back to pending when their lease expires, taken back by "
                    f"any other relay ({STOP_TIMEOUT_ENV} sets this bound)."
                )
                exit_saying(log.critical, sentence, EXIT_NOT_STOPPED, self._exit)
                return
            time.sleep(SLICE_S)
