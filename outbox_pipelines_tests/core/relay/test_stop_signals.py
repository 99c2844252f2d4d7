"""A SIGTERM always stops a relay: its handler takes no lock, and the CLI relay exits whenever the signal comes.

A Python signal handler runs in the main thread between two bytecodes, possibly while that thread holds a
lock inside a wait (a ``threading.Event``'s); a handler that took that lock would wait for it forever. One
CI run saw a CLI relay ignore SIGTERM while it reconnected to a database the test had dropped.
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.relay.group import GroupRelay
from outbox_pipelines.core.settings import GlobalSettings, Settings
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, enqueue_n, statuses
from outbox_pipelines_tests.processes import python_stacks, start_cli, wait_until

BUSY, QUIET = "busy_outbox", "quiet_outbox"


def calls_made(handler) -> list[str]:
    """Every Python function and C function ``handler(SIGTERM, None)`` calls (a lock's acquire is a C call)."""
    seen: list[str] = []

    def profile(frame, event, arg) -> None:
        if event == "call":
            seen.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")
        elif event == "c_call" and arg is not sys.setprofile:
            seen.append(f"C:{arg.__qualname__}")

    sys.setprofile(profile)
    try:
        handler(signal.SIGTERM, None)
    finally:
        sys.setprofile(None)
    return seen


def test_a_stop_request_takes_no_lock():
    """What runs as the SIGTERM handler: a plain attribute store, no Event, no lock, no C call at all."""
    settings = Settings(GlobalSettings.from_env({}), {EVENTS: events_settings()}, None)
    relay = Relay("postgresql://unused", settings.table(EVENTS), ScriptedDestination())
    group = GroupRelay("postgresql://unused", settings, [EVENTS], worker_prefix="t")
    assert calls_made(relay.request_stop) == ["loop.py:request_stop", "stop.py:request"]
    assert calls_made(group.request_stop) == ["group.py:request_stop", "stop.py:request"]


class CliRelay:
    """``outbox-pipelines relay ... --quiet --json`` in a process of its own; its stderr read as it comes."""

    def __init__(self, name: str, env: dict[str, str], *args: str) -> None:
        self.name, self.lines = name, []
        self.signalled_at: float | None = None
        self.exited_at: float | None = None
        self.process = start_cli(env, "relay", *args, "--quiet", "--json")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
        self.process.wait()
        self.exited_at = time.monotonic()

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def sigterm(self) -> None:
        self.signalled_at = time.monotonic()
        self.process.send_signal(signal.SIGTERM)

    def exited_within(self, seconds: float) -> str | None:
        """None if it exited within ``seconds`` of its SIGTERM; otherwise why not, with where each thread was."""
        assert self.signalled_at is not None, f"{self.name} was never sent SIGTERM"
        deadline = self.signalled_at + seconds
        while self.exited_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.exited_at is not None:
            took = self.exited_at - self.signalled_at
            return None if took <= seconds else f"{self.name} took {took:.1f}s to exit after SIGTERM"
        stacks = python_stacks(self.process.pid)
        stacks += "\n" + _signal_state(self.process.pid)
        self.kill_if_alive()
        why = f"{self.name} ignored SIGTERM for {seconds:.0f}s:\n{stacks}\n{''.join(self.lines)[-2000:]}"
        print(why, file=sys.stderr, flush=True)  # whole: the assertion's diff shortens it to one line
        return why

    def report(self) -> dict:
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        assert self.process.returncode == 0, f"{self.name}: exit {self.process.returncode}\n{''.join(self.lines)}"
        return json.loads(out.strip().splitlines()[-1])

    def kill_if_alive(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _signal_state(pid: int) -> str:
    """The process's pending, blocked, ignored and caught signal masks (/proc): a SIGTERM (bit 15) pending
    and blocked, or ignored, says the signal never reached Python's handler."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"(no /proc status: {exc})"
    return " ".join(line for line in lines if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))


@pytest.fixture
def databases(pg_server):
    """Three fresh databases, (name, URL) each (the test drops one under its relays); dropped at the end."""
    made = [pg_server.create_database("stop") for _ in range(3)]
    yield made
    for name, _ in made:
        pg_server.drop_database(name)


def connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def test_a_cli_relay_exits_whenever_sigterm_comes(databases, pg_server, http_sink, tmp_path):
    """SIGTERM as it starts up, just started, idle, mid-batch, reconnecting to a dropped database (at three
    points of its backoff), and a group: each exits within seconds, the batch in flight settled."""
    (_, main_url), (doomed, doomed_url), (_, group_url) = databases
    config = tmp_path / "outbox.toml"
    config.write_text(
        f'[tables.{BUSY}]\ndestination = "http"\nurl = "{http_sink.url}"\nmode = "competing"\nbatch_size = 5\n\n'
        f'[tables.{QUIET}]\ndestination = "http"\nurl = "{http_sink.url}"\nmode = "competing"\n'
    )
    for url, tables in ((main_url, (BUSY, QUIET)), (doomed_url, (QUIET,)), (group_url, (BUSY, QUIET))):
        for table in tables:
            create_table(url, table)
    with connect(main_url) as conn:
        enqueue_n(conn, BUSY, 40)
    http_sink.delay_s = 0.3  # the busy relay is mid-batch for a while

    def env(url: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        return {**base, "OUTBOX_DATABASE_URL": url, "OUTBOX_CONFIG": str(config), "PYTHONPATH": str(REPO)}

    early = CliRelay("starting up", env(main_url), "--table", QUIET)
    started = CliRelay("just started", env(main_url), "--table", QUIET)
    idle = CliRelay("idle", env(main_url), "--table", QUIET)
    busy = CliRelay("mid-batch", env(main_url), "--table", BUSY)
    reconnecting = [CliRelay(f"reconnecting {n}", env(doomed_url), "--table", QUIET) for n in range(3)]
    group = CliRelay("a group, idle", env(group_url), "--group", "default", "--max-seconds", "300")
    everyone = [early, started, idle, busy, *reconnecting, group]
    try:
        time.sleep(0.2)
        early.sigterm()  # most likely before its handlers are installed: the default action ends it
        wait_until(lambda: started.said("relaying"), 30, "the relay to start", interval_s=0.01)
        started.sigterm()
        wait_until(lambda: len(http_sink.received) >= 3, 30, "the busy relay to be mid-batch", interval_s=0.01)
        busy.sigterm()
        wait_until(lambda: all(p.said("relaying") for p in (idle, group, *reconnecting)), 30, "every relay to start")
        time.sleep(1.0)  # idle: waiting for a NOTIFY
        idle.sigterm()
        group.sigterm()
        pg_server.drop_database(doomed)  # under the reconnecting relays: they retry with a backoff
        wait_until(lambda: all(p.said("reconnect failed") for p in reconnecting), 30, "the relays to reconnect")
        for relay, after_s in zip(reconnecting, (0.0, 0.35, 1.3), strict=True):
            time.sleep(after_s)
            relay.sigterm()
        stuck = [relay.exited_within(20 if relay is busy else 10) for relay in everyone]
        assert [text for text in stuck if text] == []
    finally:
        for relay in everyone:
            relay.kill_if_alive()
    assert early.process.returncode in (0, -signal.SIGTERM)
    for relay in (started, idle, busy, *reconnecting, group):
        assert relay.report()["stopped_because"] == "stop requested", relay.name
    with connect(main_url) as conn:
        assert "sending" not in statuses(conn, BUSY)  # the batch in flight was settled before the relay exited
