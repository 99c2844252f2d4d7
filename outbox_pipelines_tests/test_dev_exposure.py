"""`outbox-pipelines dev` serves the Dagster UI, which has no login: on loopback only unless told
otherwise (issue 22, item 10), and what Dagster writes under it is private to its user.

Real processes: the CLI as a subprocess, and for the files a real `dev` with a relay run.
"""

import io
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines_tests.conftest import REPO, run_cli
from outbox_pipelines_tests.defs.test_webserver import LAUNCH, REPOSITORY, graphql, wait_status
from outbox_pipelines_tests.helpers import enqueue_n, free_port, statuses
from outbox_pipelines_tests.scratch import DEMO_PARTS


def _listening(port: int) -> bool:
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family) as probe:
                probe.settimeout(1)
                probe.connect((address, port))
                return True
        except OSError:
            continue
    return False


def _embedded_env(tmp_path: Path) -> dict[str, str]:
    """No database named: `dev` would start the embedded server under tmp_path/embedded (never the repo's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
    env["OUTBOX_EMBEDDED_DIR"] = str(tmp_path / "embedded")
    env["PYTHONPATH"] = str(REPO)
    return env


def _run_dev(env: dict[str, str], cwd: Path, *args: str, timeout: float = 45) -> subprocess.CompletedProcess[str]:
    """`outbox-pipelines dev ARGS`; one that is still running after ``timeout`` (it served) is stopped
    with SIGTERM, as Ctrl-C would, and reported with the code -1."""
    proc = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "outbox-pipelines"), "dev", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, -1, out, err)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-laptop.lan"])
def test_the_rule_refuses_an_address_others_can_reach(host):
    from outbox_pipelines.dev import check_ui_exposure

    with pytest.raises(ConfigError, match="no login") as refused:
        check_ui_exposure(host, allow_remote=False)
    assert "--allow-remote" in str(refused.value) and "proxy" in str(refused.value)
    warning = check_ui_exposure(host, allow_remote=True)
    assert warning is not None and "no login" in warning and host in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_served_without_a_word(host):
    from outbox_pipelines.core.listen import is_loopback
    from outbox_pipelines.dev import check_ui_exposure

    assert is_loopback(host)
    assert check_ui_exposure(host, allow_remote=False) is None
    assert check_ui_exposure(host, allow_remote=True) is None


def test_the_api_and_dev_share_one_rule():
    from outbox_pipelines.core.listen import is_loopback
    from outbox_pipelines.orders.api import auth

    assert auth.is_loopback is is_loopback


def test_dev_on_every_interface_exits_2_before_starting_anything(tmp_path):
    port = free_port()
    result = _run_dev(_embedded_env(tmp_path), tmp_path, "--host", "0.0.0.0", "--port", str(port))
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "no login" in result.stderr and "launch runs" in result.stderr, result.stderr
    assert "--allow-remote" in result.stderr and "proxy" in result.stderr, result.stderr
    assert not _listening(port)
    # Nothing was started: no embedded server, no Dagster home, no migrations.
    assert not (tmp_path / "embedded").exists()
    assert "using the embedded PostgreSQL" not in result.stderr and "migrations" not in result.stdout


def test_allow_remote_says_so_in_one_warning_line(tmp_path):
    # Port taken on every interface: dev warns, then stops at the port check, before starting anything.
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            _embedded_env(tmp_path), "dev", "--host", "0.0.0.0", "--allow-remote", "--port", str(port), cwd=tmp_path
        )
    assert result.returncode == 2 and f"port {port} on 0.0.0.0 is in use" in result.stderr, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "no login" in warnings[0] and "0.0.0.0" in warnings[0], result.stderr
    assert not (tmp_path / "embedded").exists()


def test_loopback_dev_is_not_refused_nor_warned(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(_embedded_env(tmp_path), "dev", "--host", "127.0.0.1", "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2 and "is in use" in result.stderr, result.stderr
    assert "WARNING" not in result.stderr and "no login" not in result.stderr


def test_help_describes_allow_remote():
    result = run_cli(dict(os.environ), "dev", "--help")
    assert result.returncode == 0
    assert "--allow-remote" in result.stdout and "no login" in " ".join(result.stdout.split())


def _modes(root: Path) -> dict[str, str]:
    """Every directory and file under ``root`` (``root`` too) with its mode, sockets left out."""
    found = {}
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
            continue
        found[str(path.relative_to(root.parent))] = oct(stat.S_IMODE(st.st_mode))
    return found


@pytest.mark.slow
def test_dev_writes_dagster_files_and_compute_logs_for_its_user_only(db_url, conn, tmp_path):
    """A real `dev` (loopback) with a relay run: .outbox/ is 0700, its Dagster home, instance file and the
    run's compute logs are 0600 files in 0700 directories, with the usual umask (022) around it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
    outbox_dir = tmp_path / "project" / ".outbox"
    env.update(OUTBOX_DATABASE_URL=db_url, OUTBOX_EMBEDDED_DIR=str(outbox_dir), PYTHONPATH=str(REPO))
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "outbox.toml").write_text(DEMO_PARTS)  # the examples' outbox_events, relayed below
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "dev.log"
    old_umask = os.umask(0o022)
    try:
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [str(REPO / ".venv" / "bin" / "outbox-pipelines"), "dev", "--port", str(port)],
                env=env,
                cwd=tmp_path / "project",
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    finally:
        os.umask(old_umask)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            try:
                if httpx.get(url + "/server_info", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        repo = None
        while repo is None and time.monotonic() < deadline:
            nodes = graphql(url, REPOSITORY).get("repositoriesOrError", {}).get("nodes") or []
            repo = nodes[0] if nodes else None
            time.sleep(0 if repo else 0.5)
        assert repo is not None, log_path.read_text()[-3000:]
        enqueue_n(conn, "outbox_events", 2, topic="org.changed", payload=lambda i: {"org_id": i})
        params = {
            "selector": {
                "repositoryLocationName": repo["location"]["name"],
                "repositoryName": repo["name"],
                "jobName": "relay_job",
            },
            "runConfigData": {"ops": {"relay_table": {"config": {"table": "outbox_events", "once": True}}}},
        }
        launched = graphql(url, LAUNCH, params=params)["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        assert wait_status(url, run_id, ("SUCCESS", "FAILURE", "CANCELED"), timeout=180) == "SUCCESS"
        assert statuses(conn, "outbox_events") == {"sent": 2}
        compute_logs = [
            p for p in (outbox_dir / "dagster_home" / "storage").rglob("*") if p.is_file() and run_id in str(p)
        ]
        assert compute_logs, sorted(_modes(outbox_dir))
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    modes = _modes(outbox_dir)
    assert modes[".outbox"] == "0o700", modes
    assert modes[".outbox/dagster_home"] == "0o700" and modes[".outbox/dagster_home/dagster.yaml"] == "0o600", modes
    readable = {path: mode for path, mode in modes.items() if int(mode, 8) & 0o077}
    assert not readable, readable


def test_dev_leaves_dagsters_idle_ticks_out_of_its_terminal_unless_verbose():
    from outbox_pipelines.dev import relay_output

    lines = [
        "2026-11-26 15:00:00 - dagster.daemon.SensorDaemon - INFO - Checking for new runs for sensor: oncall\n",
        "2026-11-26 15:00:00 - dagster.daemon.SensorDaemon - INFO - Sensor oncall skipped: all checks pass\n",
        "2026-11-26 15:00:01 - dagster.daemon.SensorDaemon - INFO - No run requests returned for x, skipping\n",
        "2026-11-26 15:00:02 - dagster - WARNING - Found a dagster instance configuration value (dagster.yaml) in\n",
        "2026-11-26 15:00:03 - dagster.daemon.SensorDaemon - INFO - Completed launch of run 1 for relay_group_a\n",
        "2026-11-26 15:00:04 - dagster - ERROR - a real error\n",
    ]
    quiet, loud = io.StringIO(), io.StringIO()
    relay_output(io.StringIO("".join(lines)), quiet, verbose=False)
    relay_output(io.StringIO("".join(lines)), loud, verbose=True)
    assert quiet.getvalue().splitlines() == [lines[4].rstrip("\n"), lines[5].rstrip("\n")]
    assert loud.getvalue() == "".join(lines)
