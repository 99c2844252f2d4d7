"""A relay group's places: at most ``size`` of its tables active at once, first come, first served.

Each active table holds two connections (its relay's session and its lease keeper's), so the places are what
bounds a group's connections whatever its number of tables (relay/group.py).
"""

import collections
import threading

from outbox_pipelines.core.relay.stop import StopRequest


class Places:
    """At most ``size`` tables active at once, handed out first come, first served (a table that gives its
    place up and asks again queues behind the tables already waiting); knows whether any table waits."""

    def __init__(self, size: int) -> None:
        self.size, self._free = size, size
        self._queue: collections.deque[object] = collections.deque()
        self._cond = threading.Condition()

    def take(self, stop: StopRequest) -> bool:
        """Wait for a place; False if the group stops first (and then no place is taken)."""
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                while not (self._free and self._queue[0] is ticket) and not stop.requested:
                    self._cond.wait(0.25)
                if stop.requested:
                    return False
                self._free -= 1
                return True
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()

    def give_back(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()

    @property
    def contended(self) -> bool:
        return bool(self._queue)
