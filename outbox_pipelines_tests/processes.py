"""Real processes the tests start, one copy of each helper: a CLI command or a relay, a free port, waiting
for a port or a condition, reading a log's tail, and stopping a process by its pid (SIGTERM, then SIGKILL).

A test that starts a process stops that process, by its pid (or its own process group), never by name.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from outbox_pipelines_tests.scratch import DEMO_PARTS

CLI = (sys.executable, "-m", "outbox_pipelines.cli")
"""``outbox-pipelines`` as the test's own interpreter runs it (no console script needed on the PATH)."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Below the kernel's ephemeral range: a port chosen inside it (what binding port 0 gives) can be taken by any
# outgoing connection's own port before the server given it binds it (a RabbitMQ node failed so: eaddrinuse).
# Drawn by the system's generator: pytest-randomly seeds ``random`` alike in each worker.
_EPHEMERAL_LOW = _ephemeral_low()
_SERVER_PORTS = range(max(1024, _EPHEMERAL_LOW - 12000), _EPHEMERAL_LOW)
_DRAW = random.SystemRandom()


def free_port() -> int:
    """A port nothing listens on now: for a server started in another process, or a connection refused."""
    for _ in range(200):
        port = _DRAW.choice(_SERVER_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {_SERVER_PORTS} after 200 tries")


def free_port_pair() -> int:
    """A port ``p`` with ``p + 1`` free as well: for a server that takes the port after the one it is given."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1 in 50 tries")


@contextmanager
def silent_port(backlog: int = 64) -> Iterator[int]:
    """A port that accepts TCP connections (the kernel completes the handshake) and never says a word: a hung
    peer, a black hole. Closed on leaving the block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(backlog)
        yield int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts a TCP connection on ``port`` (a bare connect, no request sent)."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a process's log, for a failure message (a log not there yet says so)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def start_cli(
    env: dict[str, str],
    *args: str,
    cwd: Path | str | None = None,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
    **popen: Any,
) -> "subprocess.Popen[str]":
    """``outbox-pipelines ARGS`` in a process of its own, its output as text (piped unless told otherwise)."""
    return subprocess.Popen([*CLI, *args], env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=True, **popen)


def handlers_project_env(
    cli_env: dict[str, str], project: Path, module: str, code: str, table_lines: str = "", **env: str
) -> dict[str, str]:
    """A project of its own whose ``outbox_events`` goes to in-process handlers: ``MODULE.py`` (``code``, holding a
    HandlerRegistry named ``registry``), an ``outbox.toml`` naming it (plus ``table_lines``), and the environment a
    CLI relay started for it needs (the project on PYTHONPATH, and ``env``)."""
    (project / f"{module}.py").write_text(code)
    config = project / "outbox.toml"
    config.write_text(
        DEMO_PARTS + f'[tables.outbox_events]\ndestination = "handlers"\nhandlers = "{module}:registry"\n{table_lines}'
    )
    return {**cli_env, "OUTBOX_CONFIG": str(config), "PYTHONPATH": f"{project}:{cli_env['PYTHONPATH']}", **env}


def start_relay(
    env: dict[str, str], table: str, *args: str, quiet: bool = True, **popen: Any
) -> "subprocess.Popen[str]":
    """``outbox-pipelines relay --table TABLE [--quiet] ARGS`` (see ``start_cli`` for the rest)."""
    return start_cli(env, "relay", "--table", table, *(["--quiet"] if quiet else []), *args, **popen)


class DevProject:
    """``outbox-pipelines dev --port PORT`` (the console script, as a user runs it) for a project of its own (the
    demo's parts) on ``db_url``, in a session of its own (a Ctrl-C signals its group), its output in ``dev.log``."""

    def __init__(self, tmp_path: Path, db_url: str, port: int, repo: Path, project: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_", "PYTHONWARNINGS"))}
        self.project = project or tmp_path / "project"
        self.project.mkdir(exist_ok=True)
        (self.project / "outbox.toml").write_text(DEMO_PARTS)
        env.update(OUTBOX_DATABASE_URL=db_url, OUTBOX_EMBEDDED_DIR=str(self.project / ".outbox"), PYTHONPATH=str(repo))
        self.log = tmp_path / "dev.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(repo / ".venv" / "bin" / "outbox-pipelines"), "dev", "--port", str(port)],
                env=env,
                cwd=self.project,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str, timeout: float, poll_s: float = 0.5) -> None:
        """Until ``text`` is in the log; fails (with the log's end) if dev exits or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None and time.monotonic() < deadline, (text, self.output()[-3000:])
            time.sleep(poll_s)

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_logged(
    command: Sequence[str], log: Path, *, env: dict[str, str], cwd: Path | str | None = None, **popen: Any
) -> "subprocess.Popen[bytes]":
    """``command`` in a session of its own (so it and its children can be stopped as a group), its output
    appended to ``log`` after a ``--- HH:MM:SS start: ARGS`` line: one log across restarts tells them apart."""
    with log.open("a") as out:
        out.write(f"\n--- {time.strftime('%H:%M:%S')} start: {' '.join(command[1:])}\n")
        out.flush()
        return subprocess.Popen(
            list(command), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )


def wait_port_closed(port: int, timeout_s: float = 10, interval_s: float = 0.05) -> bool:
    """After a server's stop: wait until nothing accepts on ``port`` (its listener is gone), at most
    ``timeout_s``; whether it closed. A restart on the same port then finds it free."""
    deadline = time.monotonic() + timeout_s
    while port_open(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def wait_until(
    condition: Callable[[], Any],
    timeout_s: float,
    what: str,
    interval_s: float = 0.5,
    on_timeout: Callable[[], str] | None = None,
    process: "subprocess.Popen[Any] | None" = None,
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail with ``what`` after
    ``timeout_s`` (for real processes whose progress has no database clock to move). With ``process``,
    fail at once when that process exits first, with its stderr when it was piped."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            said = process.stderr.read() if process.stderr is not None else ""
            pytest.fail(f"the process exited ({process.returncode}) before {what}: {said}", pytrace=False)
        if time.monotonic() >= deadline:
            extra = f"\n{on_timeout()}" if on_timeout else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}", pytrace=False)
        time.sleep(interval_s)


def wait_for_port(port: int, process: "subprocess.Popen[Any]", seconds: float = 30) -> None:
    """Wait until the process listens (a bare TCP connect: no HTTP request that a server would count)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def _signal(process: "subprocess.Popen[Any]", sig: int, group: bool) -> None:
    try:
        if group:
            os.killpg(process.pid, sig)  # start_new_session: the leader's pid is its group's id
        else:
            process.send_signal(sig)
    except ProcessLookupError:
        pass


def stop_process(
    process: "subprocess.Popen[Any] | None", grace_s: float = 30, *, sig: int = signal.SIGTERM, group: bool = False
) -> int | None:
    """Stop a process the test started, by its pid: ``sig`` (SIGTERM: an orderly stop, as a deploy would),
    SIGKILL if it has not exited within ``grace_s``. ``group``: signal its process group (one started with
    ``start_new_session``: a server and the children it started). Its exit code; None when it had to be
    killed or was never started."""
    if process is None:
        return None
    if process.poll() is not None:
        return process.returncode
    _signal(process, sig, group)
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal(process, signal.SIGKILL, group)
        process.wait(timeout=10)
        return None


def stop_and_read(
    process: "subprocess.Popen[str]", sig: int = signal.SIGTERM, timeout_s: float = 30
) -> tuple[int, str, str]:
    """Signal a process whose output is piped (SIGTERM unless told) and read it to the end: its exit code,
    stdout and stderr. One still running after ``timeout_s`` is killed (the test fails: TimeoutExpired)."""
    process.send_signal(sig)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return process.returncode, out or "", err or ""


def kill_process(process: "subprocess.Popen[Any]") -> None:
    """SIGKILL, as a crash would, and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def stop_processes(processes: Sequence["subprocess.Popen[Any]"], grace_s: float = 30) -> None:
    """Stop every process the test started with SIGTERM, all at once, as a deploy would. One that has not
    exited within ``grace_s`` fails the test with its Python stacks (py-spy), then is killed: a process that
    ignores an orderly stop is a bug to see, not a cleanup to hide."""
    alive = [process for process in processes if process.poll() is None]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + grace_s
    stuck: list[str] = []
    for process in alive:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stuck.append(f"pid {process.pid} ignored SIGTERM for {grace_s:.0f}s:\n{python_stacks(process.pid)}")
            process.kill()
            process.wait()
    assert not stuck, "\n".join(stuck)


def python_stacks(pid: int) -> str:
    """Every thread's stack of a running Python process (py-spy, in the dev extra), for a failure message."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        return "(py-spy is not installed: no stacks)"
    dump = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    return dump.stdout + dump.stderr
