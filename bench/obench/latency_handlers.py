"""The handler the CLI relay of the latency scenario loads (``obench.latency_handlers:registry``).

It notes time.monotonic() when each message reaches it (by event_id), stops its
own relay with SIGTERM once every expected message has arrived (the relay
settles its batch and exits cleanly), and writes what it noted to the file
OUTBOX_BENCH_LATENCY_OUT names when the process exits.
"""

import atexit
import json
import os
import signal
import threading
import time

from outbox_pipelines.core.destinations.handlers import HandlerRegistry
from outbox_pipelines.core.models import ClaimedMessage

TOPIC = "bench.latency"
_delivered: dict[str, float] = {}
_lock = threading.Lock()
_expected = int(os.environ.get("OUTBOX_BENCH_LATENCY_EXPECTED", "0"))


def _note(message: ClaimedMessage) -> None:
    now = time.monotonic()
    with _lock:
        _delivered[message.event_id] = now
        done = _expected and len(_delivered) == _expected
    if done:
        os.kill(os.getpid(), signal.SIGTERM)


@atexit.register
def _write() -> None:
    path = os.environ.get("OUTBOX_BENCH_LATENCY_OUT")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(_delivered, out)


registry = HandlerRegistry()
registry.register(TOPIC, _note)
