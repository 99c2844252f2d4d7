"""How `outbox-pipelines dev` stops: the runs in progress cancelled as the UI's Terminate does, dagster dev stopped,
then the runs its daemon launched meanwhile cancelled, and whatever dagster dev left in its session stopped."""

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from outbox_pipelines.core.storage import db

if TYPE_CHECKING:
    from dagster import DagsterRunStatus


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


def _active_statuses() -> "tuple[list[DagsterRunStatus], list[DagsterRunStatus]]":
    """The statuses of a run in progress, and of one waiting to start."""
    from dagster import DagsterRunStatus

    return (
        [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING],
        [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED],
    )


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

    in_progress, waiting = _active_statuses()
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
                except Exception as exc:  # the others must still be stopped
                    print(f"could not terminate run {run.run_id[:8]}: {exc}", file=sys.stderr)
            time.sleep(0.5)


def end_runs_left_behind(env: dict[str, str], pgid: int, since: float) -> int:
    """Stop dagster dev's processes (``_stop_group``) and cancel the runs they leave unfinished.

    The daemon runs until dagster dev has stopped it, a few seconds after the last pass of
    ``cancel_active_runs``: a sensor or schedule may launch a run in between. Left STARTING or
    STARTED, the next start marks it failed and alerts. Once dagster dev has exited nothing
    launches runs, so each run this dev's daemon created (since ``since``, a time.time()) and
    left unfinished is marked cancelling, its worker stopped with the group (a relay run
    settles its batch), and what is still not ended marked cancelled. Returns how many.
    """
    os.environ.update(env)
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    in_progress, waiting = _active_statuses()
    left = RunsFilter(statuses=in_progress + waiting, created_after=datetime.fromtimestamp(since, UTC))
    with DagsterInstance.get() as instance:
        runs = instance.get_runs(filters=left)
        for run in runs:
            if run.status in waiting:
                instance.report_run_canceled(run, message="cancelled: outbox-pipelines dev stopped before it started")
            elif run.status != DagsterRunStatus.CANCELING:
                instance.report_run_canceling(run, message="cancelling: outbox-pipelines dev is stopping")
        _stop_group(pgid)
        for run in instance.get_runs(filters=left):
            instance.report_run_canceled(run, message="cancelled: outbox-pipelines dev stopped its process")
    if runs:
        names = ", ".join(f"{r.job_name} {r.run_id[:8]}" for r in runs)
        print(f"cancelled runs launched while Dagster was stopping: {names}", flush=True)
    return len(runs)


def stop_dagster(
    proc: "subprocess.Popen[str]", url: str, env: dict[str, str], started_at: float, *, failed_to_start: bool
) -> None:
    """dev's stop: the runs in progress cancelled, then dagster dev stopped, then what its daemon launched meanwhile
    (``end_runs_left_behind``). Each step goes on when the one before fails: a stop must end."""
    if proc.poll() is None:
        print("stopping: cancelling runs in progress (relay runs settle their batch first)", flush=True)
        try:
            # Dagster's storage retries a lost database for minutes: look first, so Ctrl-C stays prompt.
            db.connect(url, connect_timeout=3).close()
            left = cancel_active_runs(env)
            if left:
                print(f"{left} runs did not end in time; they are stopped with Dagster", file=sys.stderr)
        except Exception as exc:  # stopping must go on
            print(f"could not cancel runs in progress: {exc}", file=sys.stderr)
        print("stopping Dagster: its webserver, daemon and code server", flush=True)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        if failed_to_start:  # its error is the one to read, not a word about runs it never launched
            _stop_group(proc.pid)
        else:
            db.connect(url, connect_timeout=3).close()
            end_runs_left_behind(env, proc.pid, started_at)
    except Exception as exc:  # stopping must go on
        print(f"could not cancel runs launched while Dagster was stopping: {exc}", file=sys.stderr)
        _stop_group(proc.pid)
