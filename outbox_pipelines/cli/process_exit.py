"""How a command-line process ends: at once, once its output is flushed and its atexit callbacks have run.

Python's own end tears down every module it imported, one object at a time: 30-50 ms for what a relay imports
(gc.freeze keeps about 400,000 objects), a tenth of a one-shot relay's run on a small backlog (bench/results.md,
"Issue 47"). Nothing of ours needs that teardown: files and connections are closed by the commands, logging's
handlers and an OpenTelemetry provider flush in atexit callbacks, which run here first. A process in which a
thread that is not a daemon still runs ends the usual way, which waits for it.
"""

import atexit
import os
import sys
import threading
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Exit with ``code``: at once when only daemon threads are left, else through ``sys.exit``."""
    if _other_threads_running():
        sys.exit(code)
    try:
        _flush()
        atexit._run_exitfuncs()  # logging.shutdown, an OTel provider's flush, an application's own callbacks
        _flush()
    except (OSError, ValueError):  # a closed or broken output: let Python's end report it as it always has
        sys.exit(code)
    os._exit(code)


def _other_threads_running() -> bool:
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
