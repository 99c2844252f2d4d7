"""In-process handlers: topic → handlers, every handler runs, errors aggregate.

A handler receives the ClaimedMessage and may return a reference string.
- an exception is a retry (HANDLER_ERROR; several are reported together);
- ``PermanentError`` is dead with its code (a payload it cannot parse, say);
- a topic with no handler is ``NO_SUBSCRIBERS`` — an error that retries and
  ends dead, never a silent drop;
- a topic switched off is not claimed at all: its messages wait as pending.
"""

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.errors import PermanentError
from outbox_pipelines.core.models import ClaimedMessage, Outcome

Handler = Callable[[ClaimedMessage], object]


def _text(value: str) -> str:
    """Error text a handler supplied, storable in PostgreSQL text (which cannot hold NUL)."""
    return value.replace("\x00", "\\x00")


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = {}
        self._disabled: set[str] = set()
        self._lock = threading.Lock()

    def register(self, topic: str, handler: Handler) -> Handler:
        with self._lock:
            self._handlers.setdefault(topic, []).append(handler)
        return handler

    def on(self, topic: str) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``."""
        return lambda handler: self.register(topic, handler)

    def set_enabled(self, topic: str, enabled: bool) -> None:
        with self._lock:
            (self._disabled.discard if enabled else self._disabled.add)(topic)

    def is_enabled(self, topic: str) -> bool:
        return topic not in self._disabled

    @property
    def disabled_topics(self) -> tuple[str, ...]:
        return tuple(sorted(self._disabled))

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(sorted(self._handlers))

    def handlers_for(self, topic: str) -> list[Handler]:
        return list(self._handlers.get(topic, ()))

    def dispatch(self, message: ClaimedMessage) -> Outcome:
        handlers = self._handlers.get(message.topic)
        if not handlers:
            return Outcome.retry(m.NO_SUBSCRIBERS, f"no handler is registered for topic {message.topic!r}")
        failures: list[str] = []
        permanent: PermanentError | None = None
        refs: list[str] = []
        for handler in handlers:
            name = getattr(handler, "__qualname__", repr(handler))
            try:
                result = handler(message)
            except PermanentError as exc:
                permanent = permanent or exc
                failures.append(_text(f"{name}: {exc.code}: {exc}"))
            except Exception as exc:
                failures.append(_text(f"{name}: {type(exc).__name__}: {exc}"))
            else:
                if isinstance(result, str):
                    refs.append(result)
        if permanent is not None:
            return Outcome.dead(_text(permanent.code), "; ".join(failures))
        if failures:
            summary = f"{len(failures)} of {len(handlers)} handlers failed: " + "; ".join(failures)
            return Outcome.retry(m.HANDLER_ERROR, summary)
        return Outcome.sent(ref=",".join(refs) if refs else None)


class HandlerDestination(Destination):
    """Runs the registry's handlers for each message, on ``threads`` threads at a time."""

    def __init__(self, registry: HandlerRegistry, *, name: str = "handlers", threads: int = 1) -> None:
        self.registry = registry
        self.name = name
        self.threads = max(1, threads)
        # One thread: the relay's own, no pool to hand messages over to.
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="outbox-handler") if self.threads > 1 else None

    @property
    def paused_topics(self) -> tuple[str, ...]:
        return self.registry.disabled_topics

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        # A batch of one (a quiet table, woken per message) runs on the relay's thread: handing it
        # to the pool only adds a thread switch to its latency.
        if self._pool is None or len(messages) == 1:
            return [self.registry.dispatch(message) for message in messages]
        return list(self._pool.map(self.registry.dispatch, messages))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
