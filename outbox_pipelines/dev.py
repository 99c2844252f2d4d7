"""`outbox-pipelines dev`: the embedded default (or OUTBOX_DATABASE_URL), migrations, Dagster
storage, and the Dagster UI with its daemon. Ctrl-C stops everything it started.

The UI has no login, so it is served on loopback unless ``--allow-remote`` (core/listen.py); what Dagster writes is
made with umask 077.
"""

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.listen import is_loopback
from outbox_pipelines.core.operations import upgrade
from outbox_pipelines.core.settings import load_settings_or_problem
from outbox_pipelines.core.storage import db
from outbox_pipelines.defs.dagster_home import prepare_dagster_home
from outbox_pipelines.defs.dev_stop import stop_dagster
from outbox_pipelines.defs.links import ONCALL_URL_ENV, UI_URL_ENV

if TYPE_CHECKING:
    from outbox_pipelines.oncall_page import RunningPage

log = logging.getLogger("outbox_pipelines.dev")

# dev and every process dagster dev starts (webserver, daemon, code server, runs): files for their user only.
PRIVATE_UMASK = 0o077
# Dagster's lines that tell an outbox operator nothing, left out of dev's terminal unless --verbose: a sensor or
# schedule tick with nothing to do (~86 a minute with a few relay groups), dagster dev's warning about the
# repository's dagster.yaml, which dev copies into DAGSTER_HOME (so it is the one in use), the daemon's steps
# of a launch (its "Completed launch of run ..." stays: one line a run), and every run's DEBUG events (a run
# that did nothing printed 11). A record is a line starting with its time and what follows it (a trace).
QUIET = re.compile(
    r"Checking for new runs for sensor: |Sensor \S+ skipped: |Schedule \S+ skipped: |No run requests returned for |"
    r"has no partition set, so not trying to catch up|"
    r"Evaluating schedule `|Found a dagster instance configuration value|"
    r"Creating new run for |Launching run for |Priority sorting and checking tag concurrency|Launched \d+ runs?\.|"
    r" - dagster - DEBUG - "
)
RECORD_START = re.compile(r"^(\x1b\[[0-9;]*m)?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
# A run stopped by Ctrl-C (or Terminate) ends CANCELED: Dagster logs the interrupt as a failed step and a
# cancelled run, each with a stack trace. The step's record is left out, the run's keeps its first line.
STEP_FAILURE = " - STEP_FAILURE - "
RUN_CANCELED = " - RUN_CANCELED - "
INTERRUPTED = "DagsterExecutionInterruptedError"
# dagster dev's own warning, on every start: "Function `dev_command` is superseded ... Use 'dg dev' instead".
# dev runs `dagster dev -m` on purpose (a project with an outbox.toml is no dg project).
SUPERSEDED_WARNING = "ignore:Function `dev_command` is superseded"


def relay_output(source: IO[str], sink: IO[str], verbose: bool) -> None:
    """Copy dagster dev's output to ``sink`` a record at a time: unless ``verbose``, without the QUIET records,
    a step's failure that is only the interrupt of a stop, and the stack trace of a cancelled run."""
    keep = True  # whether the lines of the current record go out
    held: list[str] = []  # a step failure's first lines, until its next line says whether it is an interrupt

    def write(*lines: str) -> None:
        sink.write("".join(lines))
        sink.flush()

    for line in source:
        if verbose:
            write(line)
            continue
        if RECORD_START.match(line):
            if held:
                write(*held)
                held.clear()
            if QUIET.search(line):
                keep = False
            elif STEP_FAILURE in line:
                held.append(line)
                keep = True
            elif RUN_CANCELED in line:
                write(line)
                keep = False
            else:
                write(line)
                keep = True
        elif held:
            if INTERRUPTED in line:
                held.clear()
                keep = False
            elif line.strip():
                write(*held, line)
                held.clear()
            else:
                held.append(line)
        elif keep and not QUIET.search(line):
            write(line)
    if held:
        write(*held)


def check_ui_exposure(host: str, allow_remote: bool) -> str | None:
    """Refuse (ConfigError, exit 2) to serve the Dagster UI on an address others can reach unless
    ``allow_remote``; return the warning to log when it is served there on purpose, else None."""
    if is_loopback(host):
        return None
    if not allow_remote:
        raise ConfigError(
            f"refusing to serve the Dagster UI on {host}: it has no login, and anyone who can reach it can "
            "launch runs (relays, replays of dead messages, backfills). Serve it on 127.0.0.1 (the default) and "
            "reach it through an authenticating proxy (docs/deploy.md), or pass --allow-remote to serve it on "
            f"{host} on purpose"
        )
    return (
        f"the Dagster UI is served on {host} with no login (--allow-remote): anyone who can reach it can "
        "launch runs; put an authenticating proxy in front of it (docs/deploy.md)"
    )


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _wait_http(url: str, proc: subprocess.Popen[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def http_url(host: str, port: int) -> str:
    """The address a browser (and an alert's link) reaches ``host:port`` at: an IPv6 address in brackets, and
    this machine's name for a wildcard address (0.0.0.0, ::), which no browser can open."""
    if host in ("0.0.0.0", "::", "[::]"):
        host = socket.getfqdn()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def link_environment(ui_url: str, oncall_url: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What dev sets for the processes dagster dev starts (the daemon's sensors, the runs): the links of alerts
    and checks point at the UI (and the on-call page) this dev serves, unless the user set them; and dagster
    dev's warning about itself is silenced (added to the user's PYTHONWARNINGS, if any)."""
    env = {UI_URL_ENV: environ.get(UI_URL_ENV) or ui_url}
    if oncall_url and not environ.get(ONCALL_URL_ENV):
        env[ONCALL_URL_ENV] = oncall_url
    env["PYTHONWARNINGS"] = ",".join(filter(None, [environ.get("PYTHONWARNINGS"), SUPERSEDED_WARNING]))
    return env


def _start_oncall_page(
    host: str, port: int, *, chosen: bool, database_url: str, ui_url: str, allow_remote: bool
) -> "RunningPage | None":
    """The on-call page, served from a thread of dev on ``port``: when that one is taken, a free one, unless it was
    ``chosen`` (--oncall-port: refused, ConfigError). None, with a word, when it cannot be served at all."""
    try:
        from outbox_pipelines.oncall_page import serve_in_thread  # Starlette and uvicorn: the webserver's
    except ImportError as exc:
        print(f"the on-call page is not served: {exc}", file=sys.stderr)
        return None
    for attempt in (port, 0) if not chosen else (port,):
        try:
            return serve_in_thread(host, attempt, database_url=database_url, ui_url=ui_url, allow_remote=allow_remote)
        except ConfigError:
            if chosen or attempt == 0:
                raise
            continue
    return None


def run_dev(
    host: str = "127.0.0.1",
    port: int = 3000,
    *,
    allow_remote: bool = False,
    verbose: bool = False,
    oncall_port: int | None = None,
) -> int:
    """Serve the Dagster UI on ``host:port`` and the on-call page on ``oncall_port`` (default ``port`` + 1, or a
    free port when that one is taken; a chosen one that is taken is refused)."""
    warning = check_ui_exposure(host, allow_remote)  # a refused start touches nothing
    if warning:
        log.warning(warning)
    os.umask(PRIVATE_UMASK)  # this process and dagster dev's (which inherit it) write for their user only
    if not _port_free(host, port):
        print(f"error: port {port} on {host} is in use; pass --port to choose another", file=sys.stderr)
        return 2
    if oncall_port is not None and not _port_free(host, oncall_port):
        print(f"error: port {oncall_port} on {host} is in use; pass --oncall-port to choose another", file=sys.stderr)
        return 2
    embedded_before = (db.embedded_dir() / "pgdata" / "postmaster.pid").exists()
    resolved = db.resolve_database(announce=True, may_start_embedded=True)
    started_embedded = resolved.embedded and not embedded_before
    project = upgrade.upgrade_project(resolved.url, load_settings_or_problem())
    print(f"migrations: {', '.join(project.applied) if project.applied else 'up to date'}")
    print(f"outbox tables: {', '.join(project.tables) if project.tables else 'none declared (outbox.toml)'}")
    ui_url = http_url(host, port)
    page = _start_oncall_page(
        host,
        (port + 1 if port < 65535 else 0) if oncall_port is None else oncall_port,
        chosen=oncall_port is not None,
        database_url=resolved.url,
        ui_url=os.environ.get(UI_URL_ENV) or ui_url,
        allow_remote=allow_remote,
    )
    env = {
        **os.environ,
        **prepare_dagster_home(resolved.url),
        **link_environment(ui_url, page.url if page else None, os.environ),
    }
    print(f"Dagster home: {env['DAGSTER_HOME']} (runs and ticks stored in PostgreSQL)")
    command = [
        str(Path(sys.executable).parent / "dagster"),
        "dev",
        "-m",
        "outbox_pipelines.definitions",
        "-h",
        host,
        "-p",
        str(port),
    ]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    # Handlers first, then the child: exec resets a handled signal to its default, but keeps an ignored
    # one. A script's `outbox-pipelines dev &` starts with SIGINT ignored, and dagster dev inheriting that
    # ignored the SIGINT it is stopped with (a 48 s stop, ended by SIGKILL).
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    started_at, failed_to_start = time.time(), False
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    threading.Thread(target=relay_output, args=(proc.stdout, sys.stdout, verbose), daemon=True).start()
    try:
        if _wait_http(ui_url + "/server_info", proc, timeout=120):
            oncall = f"\nOn-call page: {page.url}  (dead and blocked messages, replay and skip)" if page else ""
            print(
                f"\nDagster UI: {ui_url}  (schedules and sensors are on; Ctrl-C stops everything){oncall}\n",
                flush=True,
            )
        elif proc.poll() is not None:
            print("error: dagster dev exited during start-up (see its output above)", file=sys.stderr)
            failed_to_start = True
            return 1
        while not stopping and proc.poll() is None:
            time.sleep(0.3)
    finally:
        stop_dagster(proc, resolved.url, env, started_at, failed_to_start=failed_to_start)
        if page:
            page.stop()
        if started_embedded:
            db.stop_embedded()
            print("stopped the embedded PostgreSQL")
    return 0
