"""Issue 22: a handler that raises SystemExit (or any BaseException but Ctrl-C) fails its own message only.

Before: ``relay --once`` exited 3 and left the whole batch (five unrelated messages) in ``sending`` with a
live lease and an attempt spent; every re-take did the same until the attempts ran out, so one bad message
cost its neighbours their attempts. Real CLI relay processes, in-process handlers from the team's module.
"""

import signal
import time
from pathlib import Path

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import rows, statuses
from outbox_pipelines_tests.processes import handlers_project_env, start_relay, stop_and_read, wait_until

HANDLERS = '''
import os, sys, threading
from outbox_pipelines.core.destinations.handlers import HandlerRegistry

class LibraryAbort(BaseException):
    """What some libraries raise to unwind (gevent's GreenletExit, a test framework's outcome)."""

registry = HandlerRegistry()

@registry.on("ok")
def ok(message):
    with open(os.environ["HANDLED_LOG"], "a") as log:
        log.write(message.event_id + "\\n")

@registry.on("exits")
def exits(message):
    sys.exit(3)

@registry.on("aborts")
def aborts(message):
    raise LibraryAbort("unwound")

@registry.on("slow")
def slow(message):
    with open(os.environ["HANDLED_LOG"], "a") as log:
        log.write("slow-started\\n")
    threading.Event().wait(2.0)
    with open(os.environ["HANDLED_LOG"], "a") as log:
        log.write(message.event_id + "\\n")
'''


def team_project(tmp_path: Path, cli_env: dict, parallelism: int) -> dict:
    return handlers_project_env(
        cli_env,
        tmp_path,
        "team_handlers",
        HANDLERS,
        f'parallelism = {parallelism}\nbatch_size = 10\nmode = "competing"\n',
        HANDLED_LOG=str(tmp_path / "handled.log"),
    )


def enqueue(conn, topics: list[str]) -> None:
    outbox = Outbox("outbox_events")
    for n, topic in enumerate(topics):
        outbox.enqueue(conn, Message(topic=topic, payload={"n": n}, event_id=f"m{n}-{topic}"), outside_transaction=True)


@pytest.mark.parametrize("parallelism", [1, 4])
@pytest.mark.parametrize("bad_topic, raised", [("exits", "SystemExit: 3"), ("aborts", "LibraryAbort: unwound")])
def test_a_handler_base_exception_fails_its_message_and_the_batch_is_settled(
    cli_env, conn, tmp_path, parallelism, bad_topic, raised
):
    env = team_project(tmp_path, cli_env, parallelism)
    enqueue(conn, ["ok", "ok", bad_topic, "ok", "ok", "ok"])
    result = run_cli(env, "relay", "--table", "outbox_events", "--once", "--json")
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    by_topic = {}
    for row in rows(conn, "outbox_events"):
        by_topic.setdefault(row["topic"], []).append(row)
    assert [r["status"] for r in by_topic["ok"]] == ["sent"] * 5  # the neighbours were handled and settled
    [bad] = by_topic[bad_topic]
    assert (bad["status"], bad["attempts"], bad["last_error_code"]) == ("pending", 1, "HANDLER_ERROR")
    assert raised in bad["last_error"] and bad["locked_by"] is None
    handled = (tmp_path / "handled.log").read_text().split()
    assert sorted(handled) == sorted(r["event_id"] for r in by_topic["ok"])  # each once


def test_the_bad_message_goes_dead_at_its_max_attempts_and_nothing_else_pays(cli_env, conn, tmp_path):
    env = team_project(tmp_path, cli_env, 1)
    config = Path(env["OUTBOX_CONFIG"])
    config.write_text(config.read_text() + 'max_attempts = 2\nbase = "1ms"\nmax_backoff = "1ms"\njitter = 0.0\n')
    enqueue(conn, ["exits", "ok", "ok"])
    for _ in range(3):
        assert run_cli(env, "relay", "--table", "outbox_events", "--once").returncode == 0
        time.sleep(0.01)  # the 1 ms backoff (database time moves on by itself)
    found = {r["topic"]: r for r in rows(conn, "outbox_events")}
    assert (found["exits"]["status"], found["exits"]["attempts"]) == ("dead", 2)
    assert statuses(conn, "outbox_events") == {"sent": 2, "dead": 1}
    assert {r["attempts"] for r in rows(conn, "outbox_events", "topic = 'ok'")} == {1}


def test_sigint_still_stops_the_relay_cleanly_while_a_handler_runs(cli_env, conn, tmp_path):
    """The relay's own stop (SIGINT / SIGTERM) is not a handler failure: the batch finishes and is settled."""
    env = team_project(tmp_path, cli_env, 1)
    enqueue(conn, ["slow", "ok"])
    proc = start_relay(env, "outbox_events")
    log = tmp_path / "handled.log"
    wait_until(
        lambda: log.exists() and "slow-started" in log.read_text(), 30, "the slow handler to start", 0.02, process=proc
    )
    code, out, err = stop_and_read(proc, signal.SIGINT)
    assert code == 0, err
    assert "stop requested" in out
    assert statuses(conn, "outbox_events") == {"sent": 2}


def test_ctrl_c_inside_a_relay_without_signal_handlers_gives_the_batch_back(db_url, conn):
    """A relay run in an application's own thread-less script (no signal handlers): KeyboardInterrupt raised
    inside a handler stops it, and its batch is back in pending at once instead of waiting out the lease."""
    from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry

    registry = HandlerRegistry()

    @registry.on("ok")
    def interrupted(message):
        raise KeyboardInterrupt

    enqueue(conn, ["ok", "ok", "ok"])
    table = table_settings("outbox_events", mode="competing", lease_s=600.0)
    relay = Relay(db_url, table, HandlerDestination(registry))
    with pytest.raises(KeyboardInterrupt):
        relay.run(once=True)
    assert statuses(conn, "outbox_events") == {"pending": 3}
    assert {r["locked_by"] for r in rows(conn, "outbox_events")} == {None}
