"""`outbox-pipelines dev` stopped with Ctrl-C leaves no run unfinished, not even one the daemon launched while it
was stopping.

dev cancels the runs in progress, then stops dagster dev, whose daemon keeps launching for a few seconds: a sensor
that saw a backlog launched a relay run in that window, and the next start marked it failed and alerted
(`test_clean_restart_is_silent` caught it once). Here the window is made certain: the test creates runs in
Dagster's storage the moment dev says it is stopping Dagster, as the daemon would have.
"""

import os
import signal
import subprocess
import time

import pytest

from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.processes import free_port_pair
from outbox_pipelines_tests.scratch import DEMO_PARTS


@pytest.mark.slow
def test_runs_launched_while_dagster_stops_end_cancelled_not_failed_at_the_next_start(db_url, tmp_path, monkeypatch):
    from dagster import DagsterInstance, DagsterRunStatus, job, op

    from outbox_pipelines.defs.dagster_home import prepare_dagster_home

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_", "PYTHONWARNINGS"))}
    project = tmp_path / "project"
    project.mkdir()
    (project / "outbox.toml").write_text(DEMO_PARTS)
    env.update(OUTBOX_DATABASE_URL=db_url, OUTBOX_EMBEDDED_DIR=str(project / ".outbox"), PYTHONPATH=str(REPO))
    port = free_port_pair()
    log_path = tmp_path / "dev.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "outbox-pipelines"), "dev", "--port", str(port)],
            env=env,
            cwd=project,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_for(text: str, timeout: float, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while text not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (text, log_path.read_text()[-3000:])
            time.sleep(poll_s)

    @op
    def step() -> None:
        pass

    @job
    def launched_late() -> None:
        step()

    try:
        wait_for(f"Dagster UI: http://127.0.0.1:{port}", 180)
        # The storage dev's Dagster uses (same home, same database), opened before the stop so the runs land at once.
        monkeypatch.setenv("OUTBOX_EMBEDDED_DIR", str(project / ".outbox"))
        for name, value in prepare_dagster_home(db_url).items():
            monkeypatch.setenv(name, value)
        with DagsterInstance.get() as instance:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
            wait_for("stopping Dagster:", 120, poll_s=0.05)
            late = [
                instance.create_run_for_job(launched_late, status=status).run_id
                for status in (DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.NOT_STARTED)
            ]
            assert proc.wait(timeout=120) == 0, log_path.read_text()[-3000:]
            ended = [instance.get_run_by_id(run_id) for run_id in late]
            assert [run.status if run else None for run in ended] == [DagsterRunStatus.CANCELED] * 3, (
                log_path.read_text()[-3000:]
            )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log_path.read_text()
    assert all(f"launched_late {run_id[:8]}" in out for run_id in late), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
