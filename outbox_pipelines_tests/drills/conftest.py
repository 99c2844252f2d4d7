"""The drill stack: a fresh database, `outbox-pipelines dev`, the broker simulator and a webhook receiver.

One stack per test module (``drill_stack``), all real processes:

- a database cloned from the session's migrated template (``pg_server``), dropped at
  the end together with ``<db>_dagster`` (Dagster's storage, created by ``dev``);
- a webhook receiver on 127.0.0.1 (a ``ThreadingHTTPServer`` in a thread) that keeps
  every JSON body posted to ``/alerts`` with its arrival ``time.monotonic()``;
- ``outbox-pipelines broker-sim --port P`` as a subprocess, stoppable and restartable
  on the same port (an outage is a stopped broker: connection refused);
- ``outbox-pipelines dev --port Q`` as a subprocess (its own session), with
  OUTBOX_DATABASE_URL, OUTBOX_BROKER_URL, OUTBOX_ALERT_WEBHOOK_URL, OUTBOX_UI_URL,
  DAGSTER_HOME (a temp dir) and PYTHONPATH; its output goes to ``dev.log`` in the
  stack's temp dir, and the last 60 lines plus every alert received are attached to
  any failing drill's report.

Teardown stops everything by pid: SIGTERM to dev, up to 60 s for it to exit, then
SIGKILL to whatever is left in its session and in the sessions its descendants lead
(``dagster dev`` runs in a session of its own); the broker simulator by its pid.
OUTBOX_DRILL_KEEP_TMP=1 keeps the temp dir (logs, DAGSTER_HOME) for a post-mortem;
OUTBOX_DRILL_OUTAGE_S sets the broker outage drill's seconds down (60; bench/drills.py: 180).

The drills are part of the test command (``pytest -m "not soak"``, what .ci/run
runs; about 10 minutes on 2 cores); ``-m "not soak and not drill"`` leaves them out
while you work, ``-m drill`` runs only them.
"""

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.helpers import QueriesDatabase, order_payload
from outbox_pipelines_tests.processes import (
    free_port,
    port_open,
    start_logged,
    stop_process,
    tail,
    wait_port_closed,
    wait_until,
)
from outbox_pipelines_tests.scratch import DEMO_PARTS

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "outbox-pipelines")
RESULTS_ENV = "OUTBOX_DRILL_RESULTS"
# How long the broker outage drill keeps the broker down: a minute in the test command (the alert fires
# about 40 s in), three minutes when bench/drills.py measures the drills (bench/drills.md, docs/how-to/alerts.md).
OUTAGE_ENV = "OUTBOX_DRILL_OUTAGE_S"
DEFAULT_OUTAGE_S = 60.0
TABLE = "outbox_orders"
LOG_TAIL_LINES = 60

# The alert contract the drills check (see the module docstring of test_oncall_drills.py).
ALERT_FIELDS = ("status", "severity", "kind", "table", "summary", "text", "figures", "started_at", "link", "alert_key")
ALERT_STATUSES = ("firing", "resolved")
ALERT_SEVERITIES = ("warning", "error")
ALERT_KINDS = ("check", "run_failure", "relay_died")
CHECK_NAMES = ("lag", "dead_letters", "stuck", "backlog", "destination", "relay")


# -- small helpers -------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, session id, start time in clock ticks) of a live process, from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[3]), int(fields[19])


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


# -- webhook receiver ----------------------------------------------------------
@dataclass
class Alert:
    at: float  # time.monotonic() on arrival
    wall: float  # time.time() on arrival
    path: str
    body: Any

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default) if isinstance(self.body, dict) else default


@dataclass
class WebhookReceiver:
    """Every JSON body POSTed to it, with its arrival time; ``/alerts`` is the product's webhook."""

    received: list[Alert] = field(default_factory=list)
    url: str = ""
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> "WebhookReceiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with receiver._cond:
                    receiver.received.append(Alert(time.monotonic(), time.time(), self.path, body))
                    receiver._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="drill-webhook", daemon=True)
        self._thread.start()
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.url = self.base + "/alerts"
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def alerts(self) -> list[Alert]:
        """What the product posted (not the harness's own self-test posts)."""
        with self._cond:
            return [a for a in self.received if a.path.split("?")[0] == "/alerts"]

    def alerts_since(self, since: float) -> list[Alert]:
        return [a for a in self.alerts if a.at >= since]

    def wait_for(self, match: Callable[[Alert], bool], *, since: float, timeout_s: float, what: str) -> Alert:
        """The first alert at or after ``since`` that matches; fails after ``timeout_s`` (from now)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for alert in self.received:
                    if alert.path.split("?")[0] == "/alerts" and alert.at >= since and _safe(match, alert):
                        return alert
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
        pytest.fail(f"no alert {what} within {timeout_s:.0f} s", pytrace=False)


def _safe(match: Callable[[Alert], bool], alert: Alert) -> bool:
    try:
        return bool(match(alert))
    except Exception:  # a malformed alert does not match, it does not crash the wait
        return False


# -- processes -----------------------------------------------------------------
class BrokerSimProcess:
    """`outbox-pipelines broker-sim` on a fixed port; stop() and start() again simulate an outage."""

    def __init__(self, port: int, log: Path, env: dict[str, str], cwd: Path, base_args: list[str]) -> None:
        self.port, self.log, self.env, self.cwd = port, log, env, cwd
        self.base_args = base_args
        self.args: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}/orders"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, extra_args: list[str] | None = None, timeout_s: float = 30.0) -> None:
        assert not self.running, "broker-sim is already running"
        self.args = list(extra_args or [])
        command = [CLI, "broker-sim", "--port", str(self.port), *self.base_args, *self.args]
        self.proc = start_logged(command, self.log, env=self.env, cwd=self.cwd)
        deadline = time.monotonic() + timeout_s
        while not port_open(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker-sim exited with {self.proc.returncode} on start:\n{tail(self.log, 20)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker-sim did not listen on port {self.port} within {timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_process(proc, grace_s=timeout_s)
        wait_port_closed(self.port, interval_s=0.1)

    def restart(self, extra_args: list[str] | None = None) -> None:
        self.stop()
        self.start(extra_args)

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change faults of the running simulator (its POST /_faults), without a restart the relay would see."""
        answer = httpx.post(f"http://127.0.0.1:{self.port}/_faults", json=changes, timeout=10, trust_env=False)
        answer.raise_for_status()
        faults: dict[str, Any] = answer.json()
        return faults


class DevProcess:
    """`outbox-pipelines dev --port P` in its own session; output appended to ``log``."""

    def __init__(self, port: int, log: Path, env: dict[str, str], cwd: Path) -> None:
        self.port, self.log, self.env, self.cwd = port, log, env, cwd
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        # dev's session and those of the processes it started: session id -> its leader's start time
        self.sessions: dict[int, int] = {}

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, sigint_ignored: bool = False) -> None:
        """``sigint_ignored``: start it the way a shell script starts a background job
        (`outbox-pipelines dev &`), with SIGINT ignored."""
        assert not self.running, "dev is already running"
        command = [CLI, "dev", "--port", str(self.port)]
        ignore_sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.proc = start_logged(command, self.log, env=self.env, cwd=self.cwd, preexec_fn=ignore_sigint)
        self._note_leader(self.proc.pid)

    def _note_leader(self, pid: int) -> None:
        stat = _proc_stat(pid)
        if stat is not None and stat[1] == pid:
            self.sessions.setdefault(pid, stat[2])

    def _note_sessions(self) -> None:
        """Note every session leader among dev's descendants (dagster dev starts in a session of its own)."""
        if self.proc is None:
            return
        parents: dict[int, list[int]] = {}
        for pid in _all_pids():
            stat = _proc_stat(pid)
            if stat is not None:
                parents.setdefault(stat[0], []).append(pid)
        todo = [self.proc.pid]
        while todo:
            for child in parents.get(todo.pop(), []):
                self._note_leader(child)
                todo.append(child)

    def _our_sessions(self) -> set[int]:
        """Sessions still ours: the leader is the process we saw (same start time), or gone (then Linux
        cannot have reused the number while members of the session live)."""
        ours = set()
        for sid, started in self.sessions.items():
            stat = _proc_stat(sid)
            if stat is None or stat[2] == started:
                ours.add(sid)
        return ours

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Wait for /server_info; the seconds it took."""
        assert self.proc is not None
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        while True:
            self._note_sessions()
            if self.proc.poll() is not None:
                raise RuntimeError(f"outbox-pipelines dev exited with {self.proc.returncode} during start-up")
            try:
                if httpx.get(self.url + "/server_info", timeout=2.0, trust_env=False).status_code == 200:
                    self._note_sessions()
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"outbox-pipelines dev did not answer {self.url}/server_info within {timeout_s:.0f} s"
                )
            time.sleep(0.5)

    def leftovers(self) -> list[int]:
        """Live processes in dev's sessions (dev itself, dagster dev, its webserver, daemon, code server, runs)."""
        sessions = self._our_sessions()
        return [p for p in _all_pids() if (stat := _proc_stat(p)) is not None and stat[1] in sessions]

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 60.0) -> int | None:
        """Signal dev, wait up to ``grace_s`` for it to exit; its exit code (None if it had to be killed)."""
        self._note_sessions()
        code = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            try:
                code = self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                code = None
        elif self.proc is not None:
            code = self.proc.returncode
        return code

    def kill_leftovers(self) -> list[int]:
        """SIGKILL whatever is left in dev's sessions, by pid; the pids it killed."""
        left = self.leftovers()
        for _ in range(3):
            remaining = self.leftovers()
            if not remaining:
                break
            for pid in remaining:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        return left

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = httpx.post(
            self.url + "/graphql", json={"query": query, "variables": variables or {}}, timeout=30.0, trust_env=False
        )
        response.raise_for_status()
        answer = response.json()
        if answer.get("errors"):
            raise AssertionError(f"GraphQL errors: {answer['errors']}")
        return answer["data"]


FAILED_RUNS_QUERY = """
query FailedRuns {
  runsOrError(filter: {statuses: [FAILURE]}) {
    __typename
    ... on Runs { results { runId jobName status creationTime startTime endTime } }
    ... on PythonError { message }
  }
}"""

RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId jobName status }
    ... on PythonError { message }
  }
}"""


# -- the stack -------------------------------------------------------------------
class DrillStack(QueriesDatabase):
    def __init__(self, pg_server: Any) -> None:
        self.pg_server = pg_server
        self.t_start = time.monotonic()
        self.token = secrets.token_hex(3)
        self.tmp = Path(tempfile.mkdtemp(prefix="outbox-drills-"))
        (self.tmp / "outbox.toml").write_text(DEMO_PARTS)  # dev runs here: a project with the demo's tables
        self.db_name, self.db_url = pg_server.create_database()
        self.dagster_db = f"{self.db_name}_dagster"[:63]
        self.poison_key = f"drill-{self.token}-poison"
        self.receiver = WebhookReceiver().start()
        self.dev_log = self.tmp / "dev.log"
        self.broker_log = self.tmp / "broker-sim.log"
        self.results: list[dict[str, Any]] = []
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
        base_env["PYTHONPATH"] = str(REPO)
        base_env["PYTHONUNBUFFERED"] = "1"
        self.broker = BrokerSimProcess(
            free_port(), self.broker_log, base_env, self.tmp, base_args=["--bad-key", self.poison_key]
        )
        dev_port = free_port()
        self.ui_url = f"http://127.0.0.1:{dev_port}"
        self.dagster_home = self.tmp / "dagster_home"
        self.dagster_home.mkdir()
        self.dev_env = {
            **base_env,
            "OUTBOX_DATABASE_URL": self.db_url,
            "OUTBOX_BROKER_URL": self.broker.url,
            "OUTBOX_ALERT_WEBHOOK_URL": self.receiver.url,
            "OUTBOX_UI_URL": self.ui_url,
            "OUTBOX_EMBEDDED_DIR": str(self.tmp / "embedded"),  # never the repo's .outbox
            "DAGSTER_HOME": str(self.dagster_home),
        }
        self.dev = DevProcess(dev_port, self.dev_log, self.dev_env, self.tmp)

    # lifecycle
    def start(self) -> None:
        self.broker.start()
        self.dev.start()
        self.dev_ready_s = self.dev.wait_ready(timeout_s=240)

    def close(self) -> list[str]:
        problems = []
        code = self.dev.stop(signal.SIGTERM, grace_s=60)
        if self.dev.proc is not None and code is None:
            problems.append("outbox-pipelines dev did not exit within 60 s of SIGTERM (killed)")
        left = self.dev.kill_leftovers()
        if left:
            problems.append(f"processes left after dev exited (killed): {left}")
        self.broker.stop()
        self.receiver.stop()
        for name in (self.dagster_db, self.db_name):
            try:
                self.pg_server.drop_database(name)
            except psycopg.Error as exc:
                problems.append(f"could not drop {name}: {exc}")
        if os.environ.get("OUTBOX_DRILL_KEEP_TMP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
        return problems

    def ensure_healthy(self) -> None:
        """Between drills: the broker up with its default faults, dev up."""
        if not self.broker.running or self.broker.args:
            self.broker.restart()
        if not self.dev.running:
            self.dev.start()
            self.dev.wait_ready(timeout_s=240)

    # database
    @property
    def database_url(self) -> str:
        return self.db_url

    def statuses(self, where: str = "true", params: Any = None) -> dict[str, int]:
        found = self.query(f"SELECT status, count(*) AS n FROM {TABLE} WHERE {where} GROUP BY status", params)
        return {r["status"]: r["n"] for r in found}

    def orders(self, prefix: str, n: int, start: int = 0) -> list[Message]:
        """``n`` valid orders; event ids (the broker's Idempotency-Key) ``drill-<token>-<prefix>-<i>``."""
        messages = []
        for i in range(start, start + n):
            key = f"drill-{self.token}-{prefix}-{i}"
            payload = order_payload(i, key=key)
            payload["order_id"] = key[:64]
            messages.append(Message(topic="order.submitted", payload=payload, event_id=key))
        return messages

    def enqueue(self, messages: list[Message], batch: int = 1000, one_transaction: bool = True) -> float:
        """Enqueue into outbox_orders in batches; the monotonic time of the (last) commit."""
        outbox = Outbox(TABLE)
        with self.connect(autocommit=False) as conn:
            for i in range(0, len(messages), batch):
                outbox.enqueue_many(conn, messages[i : i + batch], outside_transaction=True)
                if not one_transaction:
                    conn.commit()
            conn.commit()
        return time.monotonic()

    def wait_sent(self, prefix: str, n: int, timeout_s: float) -> None:
        pattern = f"drill-{self.token}-{prefix}-%"

        def sent() -> bool:
            return (
                self.scalar(f"SELECT count(*) FROM {TABLE} WHERE event_id LIKE %s AND status = 'sent'", (pattern,)) >= n
            )

        wait_until(
            sent,
            timeout_s,
            f"all {n} '{prefix}' orders sent",
            on_timeout=lambda: f"statuses of '{prefix}': {self.statuses('event_id LIKE %s', (pattern,))}",
        )

    # results
    def record(self, drill: str, seconds: float) -> None:
        entry = {"drill": drill, "seconds": round(seconds, 2)}
        self.results.append(entry)
        path = os.environ.get(RESULTS_ENV)
        if path:
            with open(path, "a") as out:
                out.write(json.dumps(entry) + "\n")

    # diagnostics
    def alert_lines(self, alerts: list[Alert] | None = None) -> str:
        alerts = self.receiver.alerts if alerts is None else alerts
        if not alerts:
            return "(no alerts received)"
        return "\n".join(f"+{a.at - self.t_start:7.1f}s {json.dumps(a.body, default=str)[:600]}" for a in alerts)

    def diagnostics(self) -> str:
        parts = [
            f"stack: db {self.db_name}, dev {self.ui_url} (pid {self.dev.proc.pid if self.dev.proc else '-'}, "
            f"running={self.dev.running}), broker {self.broker.url} (running={self.broker.running}, "
            f"args={self.broker.args}), tmp {self.tmp}",
        ]
        with contextlib.suppress(Exception):
            parts.append(f"{TABLE} statuses: {self.statuses()}")
        dev_log = tail(self.dev_log, LOG_TAIL_LINES)
        parts.append(f"--- last {LOG_TAIL_LINES} lines of {self.dev_log.name} ---\n{dev_log}")
        parts.append(f"--- last 10 lines of {self.broker_log.name} ---\n{tail(self.broker_log, 10)}")
        parts.append(f"--- alerts received ({len(self.receiver.alerts)}) ---\n{self.alert_lines()}")
        return "\n".join(parts)


_ACTIVE: list[DrillStack] = []


@pytest.fixture(scope="module")
def drill_stack(pg_server: Any) -> Iterator[DrillStack]:
    with running_stack(pg_server) as stack:
        yield stack


@contextlib.contextmanager
def running_stack(pg_server: Any, configure: Callable[[DrillStack], None] | None = None) -> Iterator[DrillStack]:
    """A started stack, stopped at the end; ``configure`` adjusts it (e.g. dev's environment) before it starts."""
    stack = DrillStack(pg_server)
    if configure is not None:
        configure(stack)
    _ACTIVE.append(stack)
    try:
        try:
            stack.start()
        except Exception as exc:
            raise RuntimeError(f"the drill stack did not start: {exc}\n{stack.diagnostics()}") from exc
        yield stack
    finally:
        _ACTIVE.remove(stack)
        problems = stack.close()
        if problems:
            print("drill stack teardown: " + "; ".join(problems), file=sys.stderr)


@pytest.fixture
def stack(drill_stack: DrillStack) -> DrillStack:
    """The module's stack, healthy (broker up with default faults, dev up) at the start of the test."""
    drill_stack.ensure_healthy()
    return drill_stack


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _ACTIVE and item.get_closest_marker("drill"):
        with contextlib.suppress(Exception):
            report.sections.append(("drill stack", _ACTIVE[-1].diagnostics()))


def outage_seconds() -> float:
    raw = os.environ.get(OUTAGE_ENV, "")
    return float(raw) if raw else DEFAULT_OUTAGE_S


def parse_time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
