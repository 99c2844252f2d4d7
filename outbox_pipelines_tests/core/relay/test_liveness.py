"""Relay liveness with real relay processes: a relay that dies gives its rows back at once, and on-call hears once."""

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from outbox_pipelines.core.oncall.sweep import sweep
from outbox_pipelines.core.relay import liveness
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.defs.links import DagsterLinks
from outbox_pipelines_tests.helpers import audit_codes, db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.processes import kill_process, silent_port, start_relay, stop_and_read, wait_until
from outbox_pipelines_tests.rows import expire_leases

EVENTS = "outbox_events"


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections (the kernel does) and never answers: a hung destination."""
    with silent_port(128) as port:
        yield f"http://127.0.0.1:{port}/"


@pytest.fixture
def relay_env(cli_env, tmp_path: Path, silent_server: str) -> dict[str, str]:
    """outbox_events delivered over HTTP to the hung destination, with a 60 s timeout."""
    config = tmp_path / "outbox.toml"
    config.write_text(
        f'[tables.{EVENTS}]\ndestination = "http"\nurl = "{silent_server}"\ntimeout = "60s"\nmode = "competing"\n'
    )
    return {**cli_env, "OUTBOX_CONFIG": str(config)}


def workers(conn) -> list[dict]:
    return conn.execute("SELECT * FROM outbox_relay_workers ORDER BY started_at").fetchall()


@pytest.fixture
def killed_relay(conn, relay_env):
    """A relay process that claimed 5 rows (stuck on the hung destination) and was SIGKILLed."""
    enqueue_n(conn, EVENTS, 5)
    proc = start_relay(relay_env, EVENTS)
    try:
        wait_until(
            lambda: statuses(conn, EVENTS).get("sending") == 5, 30, "the relay to hold the rows", 0.05, process=proc
        )
        [worker] = workers(conn)
        assert (worker["pid"], worker["table_name"], worker["stopped_at"]) == (proc.pid, EVENTS, None)
        # Alive, even when its heartbeat looks old (a slow beat, a database blip): never declared dead.
        assert liveness.find_dead(conn, now=db_now(conn) + timedelta(seconds=30)) == []
    finally:
        kill_process(proc)
    return proc, worker


def test_a_killed_relay_is_found_dead_and_its_rows_return_at_once(conn, killed_relay):
    proc, worker = killed_relay
    assert liveness.find_dead(conn) == []  # silent for a few seconds only: not yet (20 s)
    later = db_now(conn) + timedelta(seconds=30)
    [dead] = liveness.find_dead(conn, now=later)
    assert (dead.worker, dead.table, dead.pid, dead.host, dead.run_id) == (
        worker["worker"],
        EVENTS,
        proc.pid,
        liveness.HOST,
        None,
    )
    assert dead.silent_s >= 30

    buried = liveness.bury(conn, dead, max_attempts=25)
    assert (buried.held, buried.returned) == (5, 5)
    # Back to pending now, without waiting out their 60 s lease, their attempt counted.
    assert [(r["status"], r["attempts"], r["locked_by"]) for r in rows(conn, EVENTS)] == [("pending", 1, None)] * 5
    assert len(OutboxTable(conn, EVENTS).claim("next-relay", 10, 60)) == 5
    for row in rows(conn, EVENTS):
        assert audit_codes(conn, EVENTS, row["id"]) == ["outbox_claim", "outbox_requeue", "outbox_claim"]
    requeue = conn.execute("SELECT worker, detail FROM outbox_audit WHERE code = 'outbox_requeue'").fetchall()
    assert {(r["worker"], r["detail"]) for r in requeue} == {("liveness", f"lease of {worker['worker']} expired")}
    [after] = workers(conn)
    assert after["stopped_at"] is not None
    assert "presumed dead" in after["stop_reason"]
    # buried once: not found again
    assert liveness.find_dead(conn, now=later + timedelta(seconds=60)) == []


def test_sweep_tells_on_call_once_about_a_dead_relay(db_url, conn, killed_relay, http_sink):
    proc, worker = killed_relay
    settings = load_settings(env={}, path=None)
    later = db_now(conn) + timedelta(seconds=30)
    report = sweep(db_url, settings, now=later, webhook_url=http_sink.url, repeat_s=1800, links=DagsterLinks())
    assert [(d.worker, d.held, d.returned) for d in report.dead_relays] == [(worker["worker"], 5, 5)]
    died = [r.body for r in http_sink.received if r.body["kind"] == "relay_died"]
    assert len(died) == 1
    [body] = died
    assert (body["status"], body["severity"], body["table"]) == ("firing", "error", EVENTS)
    assert body["figures"]["held"] == 5 and body["figures"]["returned"] == 5
    assert (body["figures"]["pid"], body["figures"]["worker"]) == (proc.pid, worker["worker"])
    assert "it held 5 messages, 5 returned to pending" in body["summary"]
    # how long the relay had run (its time, not the process's: a group run's table relays come and go)
    ran = r"; its relay there had been running \d+(\.\d)? (ms|s|min|h|d); it held"
    assert re.search(ran, body["summary"]), body["summary"]
    assert body["link"].endswith(f"/assets/outbox/{EVENTS}?view=checks")
    assert statuses(conn, EVENTS) == {"pending": 5}
    # the rows are not counted as stuck by the checks any more
    assert {v.name: v.severity for v in report.verdicts[EVENTS]}["stuck"] == "ok"

    again = sweep(db_url, settings, now=later + timedelta(seconds=15), webhook_url=http_sink.url, repeat_s=1800)
    assert again.dead_relays == []
    assert [r.body["kind"] for r in http_sink.received].count("relay_died") == 1


def test_a_relay_stopped_cleanly_is_never_found_dead(conn, relay_env):
    proc = start_relay(relay_env, EVENTS)
    try:
        wait_until(lambda: len(workers(conn)) == 1, 30, "the relay to register", 0.05, process=proc)
        [worker] = workers(conn)
        assert worker["pid"] == proc.pid
        # Its heartbeat looks an hour old, but the process is alive: not dead.
        conn.execute("UPDATE outbox_relay_workers SET heartbeat_at = now() - interval '1 hour'")
        assert liveness.find_dead(conn) == []
    finally:
        code, _, err = stop_and_read(proc)
    assert code == 0, err
    [stopped] = workers(conn)
    assert stopped["stopped_at"] is not None
    assert stopped["stop_reason"] == "stop requested"
    assert liveness.find_dead(conn, now=db_now(conn) + timedelta(hours=2)) == []


def gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def add_worker(
    conn,
    worker: str,
    *,
    host: str,
    pid: int | None,
    silent_s: float,
    run_id: str | None = None,
    job: str | None = None,
    table: str = EVENTS,
) -> None:
    conn.execute(
        "INSERT INTO outbox_relay_workers (worker, table_name, run_id, job, pid, host, started_at, heartbeat_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, now() - interval '10 minutes', now() - make_interval(secs => %s))",
        (worker, table, run_id, job, pid, host, silent_s),
    )


def test_a_relay_on_another_host_is_dead_only_after_a_minute(conn):
    add_worker(conn, "remote", host="some-other-host", pid=1, silent_s=0)
    t0 = db_now(conn)
    assert liveness.find_dead(conn, now=t0 + timedelta(seconds=30)) == []  # silent but may be alive elsewhere
    [dead] = liveness.find_dead(conn, now=t0 + timedelta(seconds=61))
    assert (dead.worker, dead.host) == ("remote", "some-other-host")


def test_rows_out_of_attempts_go_dead_and_are_not_counted_as_returned(conn):
    ids = enqueue_n(conn, EVENTS, 3)
    add_worker(conn, "ghost", host=liveness.HOST, pid=gone_pid(), silent_s=60)
    outbox_table = OutboxTable(conn, EVENTS)
    outbox_table.claim("ghost", 2, 600)  # ids[0], ids[1] at attempt 1
    outbox_table.claim("someone-else", 1, 600)  # ids[2]: not the dead relay's
    [dead] = liveness.find_dead(conn)
    buried = liveness.bury(conn, dead, max_attempts=1)
    found = {r["id"]: (r["status"], r["last_error_code"]) for r in rows(conn, EVENTS)}
    assert found == {ids[0]: ("dead", "LEASE_EXPIRED"), ids[1]: ("dead", "LEASE_EXPIRED"), ids[2]: ("sending", None)}
    assert audit_codes(conn, EVENTS, ids[0])[-1] == "outbox_flush_dead"
    assert buried.held == 2
    # None went back to pending: telling on-call "2 returned to pending" would be false.
    assert buried.returned == 0


def test_a_dead_relay_of_a_dagster_run_links_to_its_run(db_url, conn, http_sink):
    add_worker(
        conn,
        "run-relay",
        host=liveness.HOST,
        pid=gone_pid(),
        silent_s=45,
        run_id="0123456789abcdef",
        job="relay_group_default_job",
    )
    report = sweep(
        db_url, load_settings(env={}, path=None), webhook_url=http_sink.url, repeat_s=1800, links=DagsterLinks()
    )
    assert [d.run_id for d in report.dead_relays] == ["0123456789abcdef"]
    [body] = [r.body for r in http_sink.received if r.body["kind"] == "relay_died"]
    assert (body["run_id"], body["job"]) == ("0123456789abcdef", "relay_group_default_job")  # as the relay recorded
    assert body["link"].endswith("/runs/0123456789abcdef")
    assert "relay run 01234567 died" in body["summary"]
    assert "it held 0 messages, 0 returned" in body["summary"]


def test_the_relays_of_one_dead_group_run_are_told_in_one_alert(db_url, conn, http_sink):
    """A relay group's run hosts many tables' relays: when its process dies, on-call hears once, with every
    table and every row that went back."""
    enqueue_n(conn, EVENTS, 2)
    enqueue_n(conn, "outbox_memory", 3)
    pid = gone_pid()
    for table in (EVENTS, "outbox_memory"):
        add_worker(
            conn,
            f"group-relay:{table}",
            host=liveness.HOST,
            pid=pid,
            silent_s=45,
            run_id="feedfacecafe0001",
            job="relay_group_default_job",
            table=table,
        )
        OutboxTable(conn, table).claim(f"group-relay:{table}", 10, 600)
    report = sweep(db_url, load_settings(env={}, path=None), webhook_url=http_sink.url, repeat_s=1800)
    assert len(report.dead_relays) == 2
    [body] = [r.body for r in http_sink.received if r.body["kind"] == "relay_died"]
    assert body["figures"]["tables"] == sorted([EVENTS, "outbox_memory"])
    assert (body["figures"]["held"], body["figures"]["returned"]) == (5, 5)
    assert body["summary"].startswith("2 tables (outbox_events, outbox_memory): relay run feedface died")
    assert statuses(conn, EVENTS) == {"pending": 2} and statuses(conn, "outbox_memory") == {"pending": 3}


def test_bury_counts_only_the_dead_relays_rows(conn):
    ids = enqueue_n(conn, EVENTS, 2)
    add_worker(conn, "ghost", host=liveness.HOST, pid=gone_pid(), silent_s=60)
    outbox_table = OutboxTable(conn, EVENTS)
    outbox_table.claim("ghost", 1, 600)  # ids[0]
    outbox_table.claim("alive", 1, 600)  # ids[1], whose lease has just run out (its relay will requeue it)
    expire_leases(conn, EVENTS, ids[1])
    [dead] = liveness.find_dead(conn)
    buried = liveness.bury(conn, dead, max_attempts=25)
    assert rows(conn, EVENTS)[0]["status"] == "pending"
    assert (buried.held, buried.returned) == (1, 1)
