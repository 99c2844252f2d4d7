"""In-process handlers: topic → handlers, every handler runs, errors aggregate.

A handler receives the ClaimedMessage and may return a reference string. Any exception (but
``KeyboardInterrupt``) is that message's retry, ``PermanentError`` its death, a topic without handler a
``NO_SUBSCRIBERS`` retry. Every rule: docs/explanation/outcomes.md, "In-process handlers".
"""

import inspect
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.loop_thread import LoopThread
from outbox_pipelines.core.errors import PermanentError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.settings.handler_specs import FACTORY_MARK

Handler = Callable[[ClaimedMessage], object]


def _text(value: str) -> str:
    """Error text a handler supplied, storable in PostgreSQL text (which cannot hold NUL)."""
    return value.replace("\x00", "\\x00")


DEFAULT_TIMEOUT_S = 5.0


def _name(handler: Any) -> str:
    return str(getattr(handler, "__qualname__", None) or repr(handler))


def check_handler(topic: str, handler: Any) -> None:
    """TypeError for a handler the relay could not run: its body would never execute, the message marked sent."""
    if not callable(handler):
        raise TypeError(f"the handler of {topic!r} must be a function (got {type(handler).__name__}: {handler!r})")
    target = getattr(handler, "__call__", None) if not inspect.isroutine(handler) else handler  # noqa: B004
    kinds = ((inspect.isasyncgenfunction, "an async generator"), (inspect.isgeneratorfunction, "a generator"))
    for test, kind in kinds:
        if test(handler) or test(target):
            raise TypeError(
                f"the handler {_name(handler)} of {topic!r} is {kind} function: calling it runs nothing. "
                "Write a plain `def` or an `async def` that does the work and returns (a reference string, or None)"
            )


# The attribute ``HandlerRegistry.factory`` sets on a function: a ``handlers`` spec may name it.
class HandlerRegistry:
    __outbox_handler_registry__ = True  # settings/handler_specs.py: what a spec may name

    @staticmethod
    def factory(function: Callable[[], "HandlerRegistry"]) -> Callable[[], "HandlerRegistry"]:
        """Mark a function of no arguments that returns a HandlerRegistry, so that a table's ``handlers`` spec
        may name it: the relay calls it once when it builds the table's destination. A spec naming any other
        function is refused when the settings load, never called."""
        if not callable(function) or not hasattr(function, "__dict__"):
            raise TypeError(f"@HandlerRegistry.factory marks a function, got {type(function).__name__}")
        setattr(function, FACTORY_MARK, True)
        return function

    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = {}
        self._disabled: set[str] = set()
        self._lock = threading.Lock()

    def register(self, topic: str, handler: Handler) -> Handler:
        """Add ``handler`` (a ``def`` or an ``async def`` taking the ClaimedMessage) for ``topic``; TypeError for a
        handler the relay could not run (a generator, an async generator, not callable)."""
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"a handler's topic must be a non-empty string, got {topic!r}")
        check_handler(topic, handler)
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

    def dispatch(self, message: ClaimedMessage, awaiting: "Awaiting | None" = None) -> Outcome:
        """Run every handler of the message's topic. ``awaiting`` runs what an async handler returns; without it
        (a registry called directly) a private loop runs it, with the default timeout."""
        handlers = self._handlers.get(message.topic)
        if not handlers:
            return Outcome.retry(m.NO_SUBSCRIBERS, f"no handler is registered for topic {message.topic!r}")
        failures: list[str] = []
        timed_out = False
        permanent: PermanentError | None = None
        refs: list[str] = []
        for handler in handlers:
            name = _name(handler)
            try:
                result = handler(message)
                if inspect.isawaitable(result):
                    result = (awaiting or _default_awaiting()).result(result)
            except PermanentError as exc:
                permanent = permanent or exc
                failures.append(_text(f"{name}: {exc.code}: {exc}"))
            except KeyboardInterrupt:
                raise
            except HandlerTimedOut as exc:
                timed_out = True
                failures.append(_text(f"{name}: {exc}"))
            except BaseException as exc:  # SystemExit and the like: this message's failure
                failures.append(_text(f"{name}: {type(exc).__name__}: {exc}"))
            else:
                if isinstance(result, str):
                    refs.append(result)
        if permanent is not None:
            return Outcome.dead(_text(permanent.code), "; ".join(failures))
        if failures:
            summary = f"{len(failures)} of {len(handlers)} handlers failed: " + "; ".join(failures)
            return Outcome.retry(m.HANDLER_TIMEOUT if timed_out else m.HANDLER_ERROR, summary)
        return Outcome.sent(ref=",".join(refs) if refs else None)


class HandlerTimedOut(Exception):
    """An async handler still running at the table's timeout: cancelled, the message retries."""


class Awaiting:
    """Runs what async handlers return on one event loop of its own (a thread, started at the first async handler),
    each at most ``timeout_s``. The relay is synchronous: its handler threads wait here, the loop runs the
    coroutines, so async handlers of a batch run concurrently."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._loop: LoopThread | None = None
        self._lock = threading.Lock()

    def result(self, awaitable: Any) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread("outbox-async-handlers")
        outcome = self._loop.run_within(_awaited(awaitable), self.timeout_s)
        if outcome is None:
            raise HandlerTimedOut(f"still running after the table's timeout of {self.timeout_s:g}s: cancelled")
        return outcome.value

    def close(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop = None


_DEFAULT: list[Awaiting] = []


def _default_awaiting() -> Awaiting:
    """The loop of registries called directly (``registry.dispatch(message)``), made once."""
    if not _DEFAULT:
        _DEFAULT.append(Awaiting())
    return _DEFAULT[0]


class _Done:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


async def _awaited(awaitable: Any) -> _Done:
    # Wrapped, so that a handler returning None is told apart from run_within's None (timed out).
    return _Done(await awaitable)


class HandlerDestination(Destination):
    """Runs the registry's handlers for each message, on ``threads`` threads at a time.

    The relay's own thread is one of them, beside ``threads - 1`` pool threads, and every thread
    takes the batch's next message until none is left. So the first message of a batch, and most
    of a small batch whose handlers are quick, run without a hand-off to another thread (a hand-off
    is a thread woken up: it showed in the commit → handler latency and cost quick handlers a fifth
    of their throughput), while handlers that wait (mail, HTTP) still run ``threads`` at once.
    """

    def __init__(
        self,
        registry: HandlerRegistry,
        *,
        name: str = "handlers",
        threads: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self.name = name
        self.threads = max(1, threads)
        self.awaiting = Awaiting(timeout_s)
        helpers = self.threads - 1
        self._pool = ThreadPoolExecutor(helpers, thread_name_prefix="outbox-handler") if helpers else None

    @property
    def paused_topics(self) -> tuple[str, ...]:
        return self.registry.disabled_topics

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if self._pool is None or len(messages) == 1:
            return [self.registry.dispatch(message, self.awaiting) for message in messages]
        outcomes: dict[int, Outcome] = {}
        indexes = iter(range(len(messages)))  # the one cursor every lane takes from: each message once
        taking = threading.Lock()

        def lane() -> None:
            while True:
                with taking:
                    index = next(indexes, None)
                if index is None:
                    return
                outcomes[index] = self.registry.dispatch(messages[index], self.awaiting)

        helpers = [self._pool.submit(lane) for _ in range(min(self.threads, len(messages)) - 1)]
        try:
            lane()
        finally:
            # Every message is taken by now. A helper that has not started would find none: cancelled, it
            # costs no wake-up to wait for. The started ones are waited for, so no handler of this batch
            # is still running when the relay settles it.
            wait([helper for helper in helpers if not helper.cancel()])
        for helper in helpers:
            if not helper.cancelled():
                helper.result()  # dispatch catches handlers' errors; anything else is raised here
        return [outcomes[index] for index in range(len(messages))]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.awaiting.close()
