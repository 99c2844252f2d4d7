"""Concurrency and crashes with real relay processes (the CLI worker) and a real HTTP sink."""

import subprocess
import time
from datetime import timedelta

import pytest

from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.operations.maintenance import requeue_stuck
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.processes import handlers_project_env, kill_process, start_relay, stop_and_read, wait_until

ORDERS = "outbox_orders"


@pytest.mark.parametrize("workers", [2, 8])
@pytest.mark.slow
def test_concurrent_relays_deliver_each_message_exactly_once(workers, cli_env, conn, http_sink):
    enqueue_n(conn, ORDERS, 10_000, prefix="order-")
    env = {**cli_env, "OUTBOX_BROKER_URL": http_sink.url, "OUTBOX_BATCH_SIZE": "200"}
    procs = [start_relay(env, ORDERS, "--once") for _ in range(workers)]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    assert statuses(conn, ORDERS) == {"sent": 10_000}
    assert len(http_sink.received) == 10_000
    assert set(http_sink.counts.values()) == {1}
    assert set(http_sink.counts) == {f"order-{i}" for i in range(10_000)}
    claimers = conn.execute(
        "SELECT count(DISTINCT worker) AS n FROM outbox_audit WHERE code = 'outbox_claim'"
    ).fetchone()
    assert claimers["n"] >= 2  # the work really was shared
    conflicts = conn.execute("SELECT count(*) AS n FROM outbox_audit WHERE code = 'outbox_flush_conflict'").fetchone()
    assert conflicts["n"] == 0


def test_relay_killed_mid_batch_loses_nothing(db_url, cli_env, conn, http_sink):
    enqueue_n(conn, ORDERS, 30, prefix="order-")
    http_sink.delay_s = 5.0  # the relay is blocked waiting for answers when it dies
    env = {**cli_env, "OUTBOX_BROKER_URL": http_sink.url, "OUTBOX_BATCH_SIZE": "10"}
    proc = start_relay(env, ORDERS)
    wait_until(lambda: len(http_sink.received) >= 10, 30, "the relay to be mid-batch", 0.05)
    kill_process(proc)
    in_flight = rows(conn, ORDERS, "status = 'sending'")
    # The batch on the wire, and (the relay pipelines network deliveries) perhaps the next one, claimed.
    assert len(in_flight) in (10, 20) and all(r["attempts"] == 1 for r in in_flight)
    assert statuses(conn, ORDERS) == {"sending": len(in_flight), "pending": 30 - len(in_flight)}
    reached_the_broker = set(http_sink.counts)
    assert len(reached_the_broker) == 10

    # After the lease (60 s of database time) the rows come back, attempts kept.
    settings = table_settings(ORDERS, destination="http", url=http_sink.url)
    report = requeue_stuck(db_url, settings, now=db_now(conn) + timedelta(seconds=61))
    assert report.requeued == len(in_flight)
    http_sink.delay_s = 0.0
    destination = HttpDestination(http_sink.url, timeout_s=5)
    try:
        relay_report = Relay(db_url, settings, destination).run(once=True)
    finally:
        destination.close()
    assert relay_report.sent == 30
    assert statuses(conn, ORDERS) == {"sent": 30}
    retried = {r["event_id"] for r in rows(conn, ORDERS, "attempts = 2")}
    assert len(retried) == len(in_flight)  # every claimed row came back with its attempt counted
    assert all(http_sink.counts[key] == 2 for key in reached_the_broker)  # delivered again, same key


def test_sigterm_finishes_the_batch_in_flight_and_releases_nothing_held(cli_env, conn, http_sink):
    enqueue_n(conn, ORDERS, 40, prefix="order-")
    http_sink.delay_s = 1.0
    env = {**cli_env, "OUTBOX_BROKER_URL": http_sink.url, "OUTBOX_BATCH_SIZE": "10"}
    proc = start_relay(env, ORDERS)
    wait_until(lambda: len(http_sink.received) >= 10, 30, "the relay to be mid-batch", 0.05)
    code, out, err = stop_and_read(proc)
    assert code == 0, err
    assert "stop requested" in out
    found = statuses(conn, ORDERS)
    assert "sending" not in found  # every claimed row was settled before exit
    assert found.get("sent", 0) >= 10 and found["sent"] + found.get("pending", 0) == 40
    assert set(http_sink.counts.values()) == {1}


SLOW_HANDLERS = """
import os, threading, time
from outbox_pipelines.core.destinations.handlers import HandlerRegistry

registry = HandlerRegistry()
_lock = threading.Lock()


def _note(message):
    time.sleep(0.2)  # the handler's own work: a mail API answering in 200 ms
    with _lock, open(os.environ["SLOW_HANDLERS_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{message.event_id} {threading.current_thread().name}\\n")


registry.register("t", _note)
"""


def test_sigterm_while_the_relays_own_thread_runs_a_handler_finishes_the_batch(cli_env, conn, tmp_path):
    # With parallelism 4 the relay's main thread is one of the handler lanes, so the stop request
    # arrives while it is inside a handler: the batch must still finish, be settled, and not rerun.
    log = tmp_path / "handled.log"
    env = handlers_project_env(
        cli_env,
        tmp_path,
        "slow_handlers",
        SLOW_HANDLERS,
        "parallelism = 4\nbatch_size = 8\n",
        SLOW_HANDLERS_LOG=str(log),
    )
    enqueue_n(conn, "outbox_events", 40, prefix="slow-")
    proc = start_relay(env, "outbox_events")

    def handled() -> list[tuple[str, str]]:
        return [tuple(line.split()) for line in log.read_text().splitlines()] if log.exists() else []

    wait_until(lambda: len(handled()) >= 10, 30, "the relay to be in its second batch", 0.05)
    code, out, err = stop_and_read(proc)
    assert code == 0, err
    assert "stop requested" in out
    found = statuses(conn, "outbox_events")
    assert "sending" not in found  # the batch in flight was finished and settled before exit
    events = [event for event, _ in handled()]
    assert len(events) == len(set(events)) == found["sent"]  # each handled once, each handled one sent
    assert found["sent"] % 8 == 0 and found["sent"] + found.get("pending", 0) == 40
    lanes = {thread for _, thread in handled()}
    assert "MainThread" in lanes and len(lanes) == 4


QUICK_HANDLERS = """
import time
from outbox_pipelines.core.destinations.handlers import HandlerRegistry

registry = HandlerRegistry()
registry.register("t", lambda message: time.sleep(0.04))  # 40 ms of work: the next commits land meanwhile
registry.register("paused", lambda message: None)
"""


def start_events_relay(cli_env: dict, conn, tmp_path, config_lines: str, **env: str) -> subprocess.Popen:
    """``outbox-pipelines relay --table outbox_events`` with in-process handlers, once it has registered."""
    proc = start_relay(
        handlers_project_env(cli_env, tmp_path, "quick_handlers", QUICK_HANDLERS, config_lines, **env), "outbox_events"
    )
    wait_until(
        lambda: (
            proc.poll() is not None
            or conn.execute(
                "SELECT count(*) AS n FROM outbox_relay_workers "
                "WHERE table_name = 'outbox_events' AND stopped_at IS NULL"
            ).fetchone()["n"]
            == 1
        ),
        30,
        "the relay to register",
        0.05,
    )
    assert proc.poll() is None, proc.communicate()
    return proc


def test_a_trickle_reaches_a_running_relay_at_once_with_a_30_s_idle_sleep(cli_env, conn, tmp_path):
    # Messages committed one by one, some while the relay runs the previous one's handler: only their
    # NOTIFYs can bring them in promptly (the relay goes idle after each batch that emptied the queue).
    from outbox_pipelines import Message, Outbox

    proc = start_events_relay(cli_env, conn, tmp_path, "", OUTBOX_IDLE_SLEEP_MS="30000")
    try:
        for n in range(30):
            Outbox("outbox_events").enqueue(
                conn, Message(topic="t", payload={"n": n}, event_id=f"trickle-{n}"), outside_transaction=True
            )
            time.sleep(0.03)
        wait_until(lambda: statuses(conn, "outbox_events") == {"sent": 30}, 20, "all 30 sent", 0.05)
    finally:
        code, _, err = stop_and_read(proc)
    assert code == 0, err
    slowest = conn.execute("SELECT max(published_at - created_at) AS d FROM outbox_events").fetchone()["d"]
    assert slowest < timedelta(seconds=1), f"a message waited {slowest} for a relay that sleeps 30 s when idle"


def test_a_switched_off_topic_with_waiting_rows_leaves_a_running_relay_idle(cli_env, conn, tmp_path):
    enqueue_n(conn, "outbox_events", 5, topic="paused", prefix="held-")
    proc = start_events_relay(cli_env, conn, tmp_path, 'paused_topics = ["paused"]\n')

    def scans() -> int:
        return conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) AS n FROM pg_stat_user_tables "
            "WHERE relname = 'outbox_events'"
        ).fetchone()["n"]

    try:
        time.sleep(1.5)  # past the relay's start, and one flush of its statistics
        before = scans()
        time.sleep(3.0)  # the window watched: about 15 idle sleeps of 200 ms
        during = scans() - before
    finally:
        code, _, err = stop_and_read(proc)
    assert code == 0, err
    assert statuses(conn, "outbox_events") == {"pending": 5}
    # A claim and a next-due read per idle sleep read the table a few times each; claiming nonstop for
    # the due rows it may not take, it read the table thousands of times in 3 s.
    assert during < 500, f"the idle relay read the table {during} times in 3 s"
