"""`outbox-pipelines dev`'s terminal shows the outbox's lines, not Dagster's about itself, and its links point at
what it serves (issue 43, items 3 and 4): no "superseded" warning, no DEBUG line per run event, no stack trace
for a clean Ctrl-C; OUTBOX_UI_URL and OUTBOX_ONCALL_URL set for the processes dagster dev starts.

The filter on recorded lines, and a real `dev` stopped with SIGINT while a relay run is in progress.
"""

import io
import os
import signal
from pathlib import Path

import httpx
import pytest

from outbox_pipelines.dev import http_url, link_environment, relay_output
from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.processes import DevProject, free_port_pair

T = "2026-11-29 11:21:01 +0000 - dagster - "
DAEMON = "\x1b[32m2026-11-29 11:19:19 +0000\x1b[0m - dagster.daemon.SensorDaemon - \x1b[34mINFO\x1b[0m - "
TRACE = [
    "\n",
    "dagster._core.errors.DagsterExecutionInterruptedError\n",
    "\n",
    "Stack Trace:\n",
    '  File "/x/dagster/_core/execution/plan/execute_plan.py", line 243, in dagster_event_sequence_for_step\n',
    "    yield from check.generator(step_events)\n",
    "\n",
]
# What dagster dev printed for a relay run stopped by Ctrl-C (trimmed): the run's events, the daemon's launch.
STOPPED_RUN = [
    DAEMON + "Creating new run for relay_group_default_on_backlog\n",
    DAEMON + "Launching run for relay_group_default_on_backlog\n",
    DAEMON + "Completed launch of run afe92b54 for relay_group_default_on_backlog\n",
    DAEMON + "Priority sorting and checking tag concurrency limits for queued runs.\n",
    DAEMON + "Launched 1 runs.\n",
    T + "DEBUG - relay_group_default_job - afe92b54 - 10751 - RUN_START - Started execution of run.\n",
    T + "DEBUG - relay_group_default_job - afe92b54 - 10751 - relay_group - STEP_START - Started execution.\n",
    T + "INFO - relay_group_default_job - afe92b54 - relay_group - group default: sent 3 so far (+3)\n",
    T + "INFO - relay_group_default_job - afe92b54 - relay_group - termination requested: finished and settled\n",
    T + 'ERROR - relay_group_default_job - afe92b54 - 10751 - relay_group - STEP_FAILURE - Execution of step "x".\n',
    *TRACE,
    T + 'ERROR - relay_group_default_job - afe92b54 - 10751 - RUN_CANCELED - Execution of run for "x" canceled.\n',
    *TRACE,
    "\x1b[32m2026-11-29 11:21:02 +0000\x1b[0m - dagster - \x1b[34mINFO\x1b[0m - Shutting down Dagster services...\n",
]


def _filtered(lines: list[str], verbose: bool = False) -> list[str]:
    out = io.StringIO()
    relay_output(io.StringIO("".join(lines)), out, verbose=verbose)
    return out.getvalue().splitlines()


def test_a_stopped_run_leaves_its_outbox_lines_one_launch_line_and_one_cancelled_line():
    shown = _filtered(STOPPED_RUN)
    assert shown == [
        STOPPED_RUN[2].rstrip("\n"),
        STOPPED_RUN[7].rstrip("\n"),
        STOPPED_RUN[8].rstrip("\n"),
        STOPPED_RUN[10 + len(TRACE)].rstrip("\n"),
        STOPPED_RUN[-1].rstrip("\n"),
    ], "\n".join(shown)
    assert _filtered(STOPPED_RUN, verbose=True) == "".join(STOPPED_RUN).splitlines()


def test_a_step_that_really_failed_keeps_its_error_and_trace():
    failure = [
        T + 'ERROR - clean_job - 1234 - 99 - clean_op - STEP_FAILURE - Execution of step "clean_op" failed.\n',
        "\n",
        "outbox_pipelines.core.errors.RetentionTooShort: outbox_events: a retention of 5m is shorter than ...\n",
        "\n",
        "Stack Trace:\n",
        '  File "/x/outbox_pipelines/defs/maintenance.py", line 120, in clean_op\n',
        T + "INFO - next record\n",
    ]
    assert _filtered(failure) == "".join(failure).splitlines()


def test_links_point_at_what_dev_serves_unless_the_user_said_otherwise():
    env = link_environment("http://127.0.0.1:13400", "http://127.0.0.1:13401", {})
    assert env["OUTBOX_UI_URL"] == "http://127.0.0.1:13400" and env["OUTBOX_ONCALL_URL"] == "http://127.0.0.1:13401"
    assert env["PYTHONWARNINGS"] == "ignore:Function `dev_command` is superseded"
    mine = {
        "OUTBOX_UI_URL": "https://dagster.example",
        "OUTBOX_ONCALL_URL": "https://oncall",
        "PYTHONWARNINGS": "error",
    }
    env = link_environment("http://127.0.0.1:13400", "http://127.0.0.1:13401", mine)
    assert env["OUTBOX_UI_URL"] == "https://dagster.example" and "OUTBOX_ONCALL_URL" not in env
    assert env["PYTHONWARNINGS"].split(",") == ["error", "ignore:Function `dev_command` is superseded"]
    assert http_url("::1", 3000) == "http://[::1]:3000" and http_url("127.0.0.1", 80) == "http://127.0.0.1:80"


def _environments(dagster_home: Path) -> list[dict[str, str]]:
    """The environment of every process of this machine that runs on ``dagster_home`` (dagster dev's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            raw = (entry / "environ").read_bytes()
        except (OSError, ValueError):
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("DAGSTER_HOME") == str(dagster_home):
            found.append(env)
    return found


@pytest.mark.slow
def test_dev_serves_the_oncall_page_links_to_its_port_and_stops_on_ctrl_c_without_a_trace(db_url, conn, tmp_path):
    port = free_port_pair()  # dev takes --port + 1 for the on-call page when it is free
    dev = DevProject(tmp_path, db_url, port, REPO)
    project, proc, log_path, wait_for = dev.project, dev.proc, dev.log, dev.wait_for
    try:
        wait_for(f"Dagster UI: http://127.0.0.1:{port}", 180)
        wait_for(f"On-call page: http://127.0.0.1:{port + 1}", 5)
        assert httpx.get(f"http://127.0.0.1:{port + 1}/", timeout=10).status_code == 200
        enqueue_n(conn, "outbox_events", 2, topic="org.changed", payload=lambda i: {"org_id": i})
        wait_for("group default: sent 2 so far", 180)  # the backlog sensor's run, still relaying
        dagster_envs = _environments(project / ".outbox" / "dagster_home")
        assert len(dagster_envs) >= 3, dagster_envs  # dagster dev, its webserver, daemon, code server, the run
        assert {e.get("OUTBOX_UI_URL") for e in dagster_envs} == {f"http://127.0.0.1:{port}"}
        assert {e.get("OUTBOX_ONCALL_URL") for e in dagster_envs} == {f"http://127.0.0.1:{port + 1}"}
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals dev's process group
        assert proc.wait(timeout=120) == 0, log_path.read_text()[-3000:]
    finally:
        dev.kill_if_running()
    out = log_path.read_text()
    assert statuses(conn, "outbox_events") == {"sent": 2}
    assert "RUN_CANCELED" in out and "stopped cleanly; sent 2" in out, out[-3000:]
    for noise in ("Traceback", "Stack Trace", "Interrupted", " - DEBUG - ", "superseded", "tables active"):
        assert noise not in out, (noise, out[-3000:])
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port + 1}/", timeout=2)
