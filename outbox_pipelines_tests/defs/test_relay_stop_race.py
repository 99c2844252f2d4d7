"""A Terminate that lands while the run's relay is still being built (a broker connect, a slow start
under load) must still stop that relay once it exists. Missed, the relay ran its whole time budget:
`outbox-pipelines dev` waited a minute for the run and a CI drill saw an 86 s stop."""

import ctypes
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from outbox_pipelines.core.relay.stop import StopRequest
from outbox_pipelines.defs.relay import OUTCOME_TAG, Stoppable, _relay_in_thread


class _SlowStartingRelay:
    """Registers itself only after ``build_s`` and then relays until asked to stop or ``budget_s`` ends."""

    def __init__(self, build_s: float, budget_s: float) -> None:
        self.build_s, self.budget_s = build_s, budget_s
        self.stop = StopRequest()
        self.ran_s = 0.0

    def request_stop(self) -> None:
        self.stop.request()

    def start(self, started: Callable[[Stoppable], None]) -> float:
        time.sleep(self.build_s)
        started(self)
        t0 = time.monotonic()
        self.stop.wait(self.budget_s)
        self.ran_s = time.monotonic() - t0
        return self.ran_s


def _context() -> SimpleNamespace:
    tags: dict[str, str] = {}
    return SimpleNamespace(
        run_id="r" * 32,
        log=SimpleNamespace(info=lambda _msg: None),
        instance=SimpleNamespace(add_run_tags=lambda _run, new: tags.update(new)),
        tags=tags,
    )


def _interrupt(thread: threading.Thread) -> None:
    """What Dagster's Terminate does to the op's thread: an interrupt raised wherever it is. Raised in a thread
    of the test's own (pytest-xdist may run the test off the main thread, where interrupt_main cannot reach)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident or 0), ctypes.py_object(KeyboardInterrupt))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("interrupt_after_s", [0.2, 1.5])
def test_an_interrupt_before_or_after_the_relay_exists_stops_it_promptly(interrupt_after_s: float) -> None:
    relay = _SlowStartingRelay(build_s=1.0, budget_s=30.0)
    context = _context()
    ended: dict[str, object] = {}

    def op() -> None:
        t0 = time.monotonic()
        try:
            _relay_in_thread(context, relay.start, lambda ran: [f"ran {ran:.1f}s"])  # type: ignore[arg-type]
        except KeyboardInterrupt:
            ended["interrupted"] = True
        ended["took"] = time.monotonic() - t0

    op_thread = threading.Thread(target=op, name="dagster-op")
    op_thread.start()
    time.sleep(interrupt_after_s)
    _interrupt(op_thread)
    op_thread.join(timeout=45)
    assert ended.get("interrupted"), "the op's thread did not end with the interrupt"
    took = float(ended["took"])  # type: ignore[arg-type]
    assert took < 5, f"the run took {took:.1f} s to stop after its interrupt (the relay's budget is 30 s)"
    assert relay.ran_s < 2
    assert context.tags == {OUTCOME_TAG: "cancelled"}, "the run is tagged cancelled, as a clean stop"
