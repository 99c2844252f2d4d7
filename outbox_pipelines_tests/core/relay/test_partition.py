"""Nothing hangs (issue 42): a relay cut off from its database by a network partition stops within its bound on
SIGTERM, a read-only command under a partition gives up with a sentence, a connect to a black-holed address
times out; and a relay takes back the rows of a peer killed mid-batch once their lease expires.

The partition is real TCP: a proxy (outbox_pipelines_tests/partition_proxy.py) between the processes and the
test database that stops forwarding both ways while every socket stays open, so no error ever reaches them.
"""

import signal
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay.budget import check_budget
from outbox_pipelines.core.relay.group import GroupRelay
from outbox_pipelines.core.relay.group_tables import GroupReport
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import ScriptedDestination, enqueue_n, rows, statuses
from outbox_pipelines_tests.partition_proxy import PartitionProxy
from outbox_pipelines_tests.processes import kill_process, start_cli, start_relay, stop_process, wait_until

ORDERS = "outbox_orders"
BOUND_S = 3  # the stop and command bounds these tests set (OUTBOX_RELAY_STOP_TIMEOUT_S, OUTBOX_COMMAND_TIMEOUT_S)
SLACK_S = 6.5  # a process's start-up and exit on a busy machine (4 s seen in CI), on top of a bound


@pytest.fixture
def proxy(db_url: str) -> Iterator[PartitionProxy]:
    with PartitionProxy(db_url) as running:
        yield running


@pytest.mark.parametrize("which", [("--table", ORDERS), ("--group", "default")], ids=["table", "group"])
def test_a_partitioned_relay_stops_within_its_bound_on_sigterm(which, proxy, cli_env, conn, http_sink):
    enqueue_n(conn, ORDERS, 5, prefix="order-")
    env = {
        **cli_env,
        "OUTBOX_DATABASE_URL": proxy.url,
        "OUTBOX_BROKER_URL": http_sink.url,
        "OUTBOX_RELAY_STOP_TIMEOUT_S": str(BOUND_S),
    }
    relay = start_cli(env, "relay", *which, "--quiet")
    try:
        wait_until(lambda: statuses(conn, ORDERS) == {"sent": 5}, 60, "the relay to deliver through the proxy", 0.1)
        proxy.partition()
        # The relay's next statement (its idle read of when the next row is due) gets no answer.
        wait_until(lambda: proxy.waiting_clients, 30, "the relay to wait on a statement", 0.05, process=relay)
        asked = time.monotonic()
        relay.send_signal(signal.SIGTERM)
        _, err = relay.communicate(timeout=BOUND_S + 30)
        took = time.monotonic() - asked
    finally:
        stop_process(relay, grace_s=1, sig=signal.SIGKILL)
    assert relay.returncode == 1, err
    assert f"did not stop within {BOUND_S}s of the stop request" in err, err
    assert "OUTBOX_RELAY_STOP_TIMEOUT_S sets this bound" in err
    assert BOUND_S <= took < BOUND_S + SLACK_S, took
    assert "Traceback" not in err


def test_status_under_a_partition_gives_up_with_a_sentence(proxy, cli_env):
    env = {**cli_env, "OUTBOX_DATABASE_URL": proxy.url, "OUTBOX_COMMAND_TIMEOUT_S": str(BOUND_S)}
    proxy.partition_at_next_query()  # it connects, then its first statement gets no answer
    started = time.monotonic()
    command = start_cli(env, "status")
    try:
        out, err = command.communicate(timeout=BOUND_S + 30)
        took = time.monotonic() - started
    finally:
        stop_process(command, grace_s=1, sig=signal.SIGKILL)
    assert proxy.partitioned and proxy.waiting_clients == 1
    assert command.returncode == 1, err
    assert err.strip().splitlines()[-1] == (
        f"error: outbox-pipelines status: no answer within {BOUND_S}s (a database that does not answer: a network "
        "partition, a server or a lock that holds the statement); gave up (OUTBOX_COMMAND_TIMEOUT_S sets this bound)"
    )
    assert took < BOUND_S + SLACK_S, took


def test_db_status_at_a_black_holed_address_says_the_connect_timed_out(proxy, cli_env):
    env = {**cli_env, "OUTBOX_DATABASE_URL": proxy.url, "OUTBOX_DB_CONNECT_TIMEOUT_S": "2"}
    proxy.partition()  # it accepts the connection and never answers
    started = time.monotonic()
    command = start_cli(env, "db", "status")
    try:
        _, err = command.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        stop_process(command, grace_s=1, sig=signal.SIGKILL)
    assert command.returncode == 1, err
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{proxy.port}" in err or f"127.0.0.1:{proxy.port}" in err, err
    assert "connection timeout expired" in err, err
    assert took < 2 + SLACK_S, took


@pytest.mark.parametrize(
    ("which", "lease_s"),
    # A group's table goes quiet 15 s after its last work (LINGER_S): a 20 s lease expires while it is quiet.
    [(("--table", ORDERS), 4), (("--group", "default"), 20)],
    ids=["table", "quiet-table-of-a-group"],
)
def test_a_relay_takes_back_the_rows_of_a_dead_peer_once_their_lease_expires(which, lease_s, cli_env, conn, http_sink):
    enqueue_n(conn, ORDERS, 10, prefix="order-")
    http_sink.delay_s = 5.0  # the first relay is waiting for answers when it dies
    env = {
        **cli_env,
        "OUTBOX_BROKER_URL": http_sink.url,
        "OUTBOX_BATCH_SIZE": "10",
        "OUTBOX_RELAY_LOCK_TTL": f"{lease_s}s",
    }
    first = start_relay(env, ORDERS)
    wait_until(lambda: rows(conn, ORDERS, "status = 'sending'"), 30, "a leased batch", 0.05, process=first)
    kill_process(first)
    http_sink.delay_s = 0.0
    held = rows(conn, ORDERS, "status = 'sending'")
    assert len(held) == 10 and None not in {r["lease_expires_at"] for r in held}
    second = start_cli(env, "relay", *which, "--quiet")
    try:
        wait_until(lambda: statuses(conn, ORDERS) == {"sent": 10}, lease_s + 60, "every row sent", 0.2, process=second)
    finally:
        stop_process(second)
    # Taken back (database time: requeued, or re-taken by a claim) soon after the lease expired, not at the
    # 10-minute stuck threshold; delivered again on their second attempt.
    taken_back = conn.execute(
        "SELECT message_id, min(created_at) - %(lease_ends)s AS after_lease FROM outbox_audit "
        "WHERE outbox_table = %(table)s AND message_id = ANY(%(ids)s) "
        "AND (code = 'outbox_requeue' OR (code = 'outbox_claim' AND detail LIKE 're-taken%%')) GROUP BY message_id",
        {"lease_ends": max(r["lease_expires_at"] for r in held), "table": ORDERS, "ids": [r["id"] for r in held]},
    ).fetchall()
    assert len(taken_back) == 10
    assert all(r["after_lease"].total_seconds() < 5 for r in taken_back), taken_back
    assert {r["attempts"] for r in rows(conn, ORDERS)} == {2}


class Hanging(Destination):
    """A destination whose deliver does not return until the test lets it (a hung broker, a handler stuck)."""

    name = "hanging"

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        self.entered.set()
        self.release.wait()
        return [Outcome.sent() for _ in messages]

    def close(self) -> None:
        pass


def test_a_group_run_returns_within_its_bound_when_a_table_hangs(db_url, conn, tmp_path, monkeypatch):
    """The Dagster op's way: no process exit, the run ends with the stuck table named (its thread left behind)."""
    monkeypatch.setenv("OUTBOX_RELAY_STOP_TIMEOUT_S", "1")
    names = ["stuck_outbox", "fine_outbox"]
    for name in names:
        create_table(db_url, name)
    config = tmp_path / "outbox.toml"
    config.write_text("".join(f'[tables.{name}]\ndestination = "paper"\nmode = "competing"\n\n' for name in names))
    settings = load_settings(env={}, path=config)
    hanging = Hanging()
    enqueue_n(conn, "stuck_outbox", 1)
    group = GroupRelay(
        db_url,
        settings,
        names,
        worker_prefix="t",
        destinations=lambda table, _: hanging if table.name == "stuck_outbox" else ScriptedDestination(),
    )
    ran: list[GroupReport] = []
    thread = threading.Thread(target=lambda: ran.append(group.run()), daemon=True)
    thread.start()
    try:
        assert hanging.entered.wait(30)
        asked = time.monotonic()
        group.request_stop()
        thread.join(timeout=30)
        took = time.monotonic() - asked
    finally:
        hanging.release.set()
    assert ran and 1 <= took < 1 + SLACK_S, took
    assert ran[0].stopped_because == "stop requested; stuck_outbox did not stop within 1s (left running)"


@pytest.mark.parametrize("budget", ["nan", "inf", "-1"])
def test_a_budget_that_never_ends_is_refused(budget, cli_env):
    result = run_cli(cli_env, "relay", "--table", ORDERS, "--max-seconds", budget)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert budget in result.stderr.lower()
    with pytest.raises(ConfigError, match="must be a finite number of seconds, 0 or more"):
        check_budget(float(budget))
