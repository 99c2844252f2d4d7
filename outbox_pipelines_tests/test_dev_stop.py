"""`outbox-pipelines dev` stopped with Ctrl-C leaves no run unfinished, not even one the daemon launched while it
was stopping.

dev cancels the runs in progress, then stops dagster dev, whose daemon keeps launching for a few seconds: a sensor
that saw a backlog launched a relay run in that window, and the next start marked it failed and alerted
(`test_clean_restart_is_silent` caught it once). Here the window is made certain: the test creates runs in
Dagster's storage the moment dev says it is stopping Dagster, as the daemon would have.
"""

import os
import signal

import pytest

from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.processes import DevProject, free_port_pair


@pytest.mark.slow
def test_runs_launched_while_dagster_stops_end_cancelled_not_failed_at_the_next_start(db_url, tmp_path, monkeypatch):
    from dagster import DagsterInstance, DagsterRunStatus, job, op

    from outbox_pipelines.defs.dagster_home import prepare_dagster_home

    dev = DevProject(tmp_path, db_url, free_port_pair(), REPO)

    @op
    def step() -> None:
        pass

    @job
    def launched_late() -> None:
        step()

    try:
        dev.wait_for("Dagster UI: http://127.0.0.1:", 180)
        # The storage dev's Dagster uses (same home, same database), opened before the stop so the runs land at once.
        monkeypatch.setenv("OUTBOX_EMBEDDED_DIR", str(dev.project / ".outbox"))
        for name, value in prepare_dagster_home(db_url).items():
            monkeypatch.setenv(name, value)
        with DagsterInstance.get() as instance:
            os.killpg(dev.proc.pid, signal.SIGINT)  # Ctrl-C
            dev.wait_for("stopping Dagster:", 120, poll_s=0.05)
            late = [
                instance.create_run_for_job(launched_late, status=status).run_id
                for status in (DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.NOT_STARTED)
            ]
            assert dev.proc.wait(timeout=120) == 0, dev.output()[-3000:]
            ended = [instance.get_run_by_id(run_id) for run_id in late]
            assert [run.status if run else None for run in ended] == [DagsterRunStatus.CANCELED] * 3, dev.output()[
                -3000:
            ]
    finally:
        dev.kill_if_running()
    out = dev.output()
    assert all(f"launched_late {run_id[:8]}" in out for run_id in late), out[-3000:]
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.slow
def test_a_dagster_that_cannot_start_is_told_alone_exit_1(db_url, tmp_path):
    """dagster dev refusing its configuration (a project's broken dagster.yaml): dev says so and exits 1, with no
    word about runs, which no daemon launched, and leaves no process behind."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "dagster.yaml").write_text("run_storage: [\n")  # not YAML
    dev = DevProject(tmp_path, db_url, free_port_pair(), REPO, project=project)
    try:
        assert dev.proc.wait(timeout=180) == 1, dev.output()[-3000:]
    finally:
        dev.kill_if_running()
    out = dev.output()
    assert "error: dagster dev exited during start-up" in out, out[-3000:]
    assert "could not cancel" not in out and "cancelled runs" not in out, out[-3000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(dev.proc.pid, 0)  # dev's group: dagster dev and all it started are gone
