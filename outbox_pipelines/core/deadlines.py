"""Deadlines a process keeps whatever the call it waits on does (a database behind a network partition answers
nothing, and no statement_timeout reaches it): a read-only command's (``command_deadline``), and the way out
once one has passed (``exit_saying``), which the relay's stop deadline uses too (core/relay/stop.py).

``OUTBOX_COMMAND_TIMEOUT_S`` (60) bounds a read-only command (``status``, ``db status``, a ``--dry-run``):
past it, the command says so in one sentence on stderr and exits with code 1 instead of hanging.
"""

import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from outbox_pipelines.core.errors import ConfigError

COMMAND_TIMEOUT_ENV = "OUTBOX_COMMAND_TIMEOUT_S"
DEFAULT_COMMAND_TIMEOUT_S = 60
EXIT_TIMED_OUT = 1


def seconds_from_env(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    """A whole number of seconds, at least 1, from the variable ``name`` (unset: ``default``), or ConfigError."""
    raw = ((os.environ if env is None else env).get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number of seconds") from None
    if value < 1:
        raise ConfigError(f"{name}={value} must be at least 1 (seconds)")
    return value


def exit_saying(emit: Callable[[str], object], sentence: str, code: int, exit: Callable[[int], object]) -> None:
    """Say ``sentence`` through ``emit`` (on a thread of its own, waited for a second at most: a lock the stuck
    thread holds, a full stderr pipe, must not keep the process alive), then end the process with ``code``."""
    said = threading.Thread(target=emit, args=(sentence,), daemon=True, name="outbox-deadline-say")
    said.start()
    said.join(1.0)
    exit(code)


def _to_stderr(sentence: str) -> None:
    print(sentence, file=sys.stderr, flush=True)


@contextmanager
def command_deadline(
    what: str, seconds: float | None = None, exit: Callable[[int], object] = os._exit
) -> Iterator[float]:
    """The block ends within ``seconds`` (``OUTBOX_COMMAND_TIMEOUT_S`` unless given), or the process does: a
    thread of its own says "``what``: no answer ..." and exits with ``EXIT_TIMED_OUT``. For a process's entry
    point (the CLI) only: the exit is immediate, no ``finally`` runs. Gives the bound in seconds."""
    bound = float(seconds_from_env(COMMAND_TIMEOUT_ENV, DEFAULT_COMMAND_TIMEOUT_S) if seconds is None else seconds)
    done = threading.Event()

    def watch() -> None:
        if not done.wait(bound):
            exit_saying(
                _to_stderr,
                f"error: {what}: no answer within {bound:g}s (a database that does not answer: a network partition, "
                f"a server or a lock that holds the statement); gave up ({COMMAND_TIMEOUT_ENV} sets this bound)",
                EXIT_TIMED_OUT,
                exit,
            )

    threading.Thread(target=watch, daemon=True, name="outbox-command-deadline").start()
    try:
        yield bound
    finally:
        done.set()
