"""`outbox-pipelines dev`: the embedded default (or OUTBOX_DATABASE_URL), migrations, Dagster
storage, and the Dagster UI with its daemon (schedules and sensors running). Ctrl-C stops
everything it started.

The Dagster UI has no login: whoever reaches its port can launch runs, replays and backfills.
``dev`` therefore serves it on loopback only, unless ``--allow-remote`` says another address is
meant (then it logs one WARNING line); the rule is the Order API's (core/listen.py). What Dagster
writes (its instance files, run and compute logs) is made with umask 077: for its user only.
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
from pathlib import Path
from typing import IO

import httpx

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.listen import is_loopback
from outbox_pipelines.core.operations import upgrade
from outbox_pipelines.core.settings import load_settings_or_problem
from outbox_pipelines.core.storage import db
from outbox_pipelines.dagster_home import prepare_dagster_home

log = logging.getLogger("outbox_pipelines.dev")

# dev and every process dagster dev starts (webserver, daemon, code server, runs): files for their user only.
PRIVATE_UMASK = 0o077
# Dagster's lines that tell an outbox operator nothing, left out of dev's terminal unless --verbose: a sensor or
# schedule tick with nothing to do (~86 a minute with a few relay groups) and dagster dev's warning about the
# repository's dagster.yaml, which dev copies into DAGSTER_HOME (so it is the one in use).
QUIET = re.compile(
    r"Checking for new runs for sensor: |Sensor \S+ skipped: |No run requests returned for |"
    r"Evaluating schedule `|Found a dagster instance configuration value"
)


def relay_output(source: IO[str], sink: IO[str], verbose: bool) -> None:
    """Copy dagster dev's output to ``sink`` a line at a time, without the QUIET lines unless ``verbose``."""
    for line in source:
        if verbose or not QUIET.search(line):
            sink.write(line)
            sink.flush()


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


def _stop_group(pgid: int) -> None:
    """Stop what dagster dev left in its session (run workers it launched): SIGTERM lets a relay
    run finish and settle its batch; whatever is still there after 15 s is killed."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def cancel_active_runs(env: dict[str, str], timeout_s: float = 60.0) -> int:
    """Terminate every run in progress the way the UI's Terminate does, and wait for them to end.

    A terminated relay run settles its batch in flight and ends CANCELED: a clean stop pages
    nobody and leaves nothing in sending. Queued runs are cancelled before they start. The
    daemon is still up meanwhile and may launch a run (a sensor sees a table without one), so
    this repeats until a pass finds nothing active. Returns the runs still active at the end.
    """
    os.environ.update(env)
    # Imported here: Dagster adds about a second to every CLI command, and only this one needs it.
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    in_progress = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    waiting = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED]
    deadline = time.monotonic() + timeout_s
    terminated: set[str] = set()
    next_word = time.monotonic() + 5.0
    with DagsterInstance.get() as instance:
        while True:
            for run in instance.get_runs(filters=RunsFilter(statuses=waiting)):
                instance.report_run_canceled(run, message="cancelled: outbox-pipelines dev is stopping")
            active = instance.get_runs(filters=RunsFilter(statuses=in_progress))
            if not active or time.monotonic() >= deadline:
                return len(active)
            if time.monotonic() >= next_word:
                names = ", ".join(f"{r.job_name} {r.run_id[:8]} ({r.status.value})" for r in active)
                print(f"waiting for runs to end: {names}", flush=True)
                next_word = time.monotonic() + 5.0
            for run in active:
                if run.run_id in terminated and run.status == DagsterRunStatus.CANCELING:
                    continue
                try:
                    instance.run_launcher.terminate(run.run_id)
                    terminated.add(run.run_id)
                except Exception as exc:  # noqa: BLE001 - the others must still be stopped
                    print(f"could not terminate run {run.run_id[:8]}: {exc}", file=sys.stderr)
            time.sleep(0.5)


def run_dev(host: str = "127.0.0.1", port: int = 3000, *, allow_remote: bool = False, verbose: bool = False) -> int:
    warning = check_ui_exposure(host, allow_remote)  # a refused start touches nothing
    if warning:
        log.warning(warning)
    os.umask(PRIVATE_UMASK)  # this process and dagster dev's (which inherit it) write for their user only
    if not _port_free(host, port):
        print(f"error: port {port} on {host} is in use; pass --port to choose another", file=sys.stderr)
        return 2
    embedded_before = (db.embedded_dir() / "pgdata" / "postmaster.pid").exists()
    resolved = db.resolve_database(announce=True, may_start_embedded=True)
    started_embedded = resolved.embedded and not embedded_before
    project = upgrade.upgrade_project(resolved.url, load_settings_or_problem())
    print(f"migrations: {', '.join(project.applied) if project.applied else 'up to date'}")
    print(f"outbox tables: {', '.join(project.tables) if project.tables else 'none declared (outbox.toml)'}")
    env = {**os.environ, **prepare_dagster_home(resolved.url)}
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
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    threading.Thread(target=relay_output, args=(proc.stdout, sys.stdout, verbose), daemon=True).start()
    url = f"http://{host}:{port}"
    try:
        if _wait_http(url + "/server_info", proc, timeout=120):
            print(f"\nDagster UI: {url}  (schedules and sensors are on; Ctrl-C stops everything)\n", flush=True)
        elif proc.poll() is not None:
            print("error: dagster dev exited during start-up (see its output above)", file=sys.stderr)
            return 1
        while not stopping and proc.poll() is None:
            time.sleep(0.3)
    finally:
        if proc.poll() is None:
            print("stopping: cancelling runs in progress (relay runs settle their batch first)", flush=True)
            try:
                # Dagster's storage retries a lost database for minutes: look first, so Ctrl-C stays prompt.
                db.connect(resolved.url, connect_timeout=3).close()
                left = cancel_active_runs(env)
                if left:
                    print(f"{left} runs did not end in time; they are stopped with Dagster", file=sys.stderr)
            except Exception as exc:  # noqa: BLE001 - stopping must go on
                print(f"could not cancel runs in progress: {exc}", file=sys.stderr)
            proc.send_signal(signal.SIGINT)  # dagster dev shuts down its webserver, daemon and code server
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        _stop_group(proc.pid)
        if started_embedded:
            db.stop_embedded()
            print("stopped the embedded PostgreSQL")
    return 0
