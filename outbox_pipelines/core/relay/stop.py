"""A stop request (SIGTERM, Ctrl-C, Dagster's termination, a relay group letting go), and waiting on it.

Why not a ``threading.Event``: a Python signal handler runs in the main thread between two bytecodes,
possibly while that same thread is inside ``Event.wait`` and holds the Event's internal lock (just before
or after its timed sleep). ``Event.set()`` from the handler then waits for that lock forever: the relay
neither stops nor relays, and a second SIGTERM only stacks another blocked handler on top (reproduced on
CPython 3.11; CPython issue 126434 describes it for ``multiprocessing.Event``). So a request is one plain
attribute store, which takes no lock and is safe from a signal handler and from any thread, and a wait
on it is a sleep cut in slices of ``SLICE_S``: whoever asks, a wait ends within a slice.
"""

import time

# How soon a wait notices a stop request. A stop is rare and a slice's wake-up costs microseconds.
SLICE_S = 0.1


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
