"""Seed 000's definition of done, end to end: Order API → outbox_orders → relay → broker → ledger.

The broker is ``BrokerSim`` on a real socket (it executes each Idempotency-Key
once and answers 409 "already processed" to a repeat); the relay is the
product's ``run_table_relay`` with outbox_orders pointed at it. Time moves in
the database (``available_at = now()``), never by sleeping.
"""

import os
import time
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from outbox_pipelines.core.relay import Relay, RelayReport, run_table_relay
from outbox_pipelines.core.telemetry import metrics
from outbox_pipelines.orders.api.app import ACCEPTANCE_STATUS
from outbox_pipelines.orders.broker import OrderBroker
from outbox_pipelines.orders.broker_sim import BrokerSim, Faults
from outbox_pipelines.orders.ledger import KeyReused, SettledOrder, record_outcomes
from outbox_pipelines.orders.model import broker_request, broker_timeout_s, result_digest
from outbox_pipelines_tests.api.conftest import (
    broker_settings,
    ledger,
    order,
    paper_settings,
    post_order,
    sample,
)
from outbox_pipelines_tests.conftest import REPO, run_cli, table_settings
from outbox_pipelines_tests.helpers import accept_order, audit_codes, order_payload, rows
from outbox_pipelines_tests.processes import free_port, start_cli, stop_and_read, wait_for_port
from outbox_pipelines_tests.rows import make_due

TABLE = "outbox_orders"
KEY = "01JB4A-ORDER-PATH-0001"


def relay(db_url: str, broker_url: str) -> RelayReport:
    """One relay pass over outbox_orders (what a Dagster relay run does), to the broker at ``broker_url``."""
    return run_table_relay(db_url, broker_settings(broker_url), TABLE, once=True)


def the_row(conn: psycopg.Connection, event_id: str = KEY) -> dict:
    [row] = rows(conn, TABLE, f"event_id = '{event_id}'")
    return row


def the_entry(conn: psycopg.Connection, key: str = KEY) -> dict:
    [entry] = ledger(conn, f"idempotency_key = '{key}'")
    return entry


def backoff_s(conn: psycopg.Connection, event_id: str = KEY) -> float:
    """The retry delay the relay chose, in database time: available_at - the settle time (updated_at)."""
    row = conn.execute(
        f"SELECT available_at - updated_at AS delay, available_at > now() AS waiting FROM {TABLE} WHERE event_id = %s",
        (event_id,),
    ).fetchone()
    assert row["waiting"], "a retried order waits for its backoff"
    return row["delay"].total_seconds()


def dispatched(result: str) -> float:
    return sample("outbox_dispatch_total", table=TABLE, result=result)


# -- DoD: the same key ten times → executed once -------------------------------------------------------
def test_one_key_submitted_ten_times_is_executed_once(client, conn, db_url, broker_sim):
    sim = broker_sim()
    first = [post_order(client, order(KEY)) for _ in range(5)]
    assert relay(db_url, sim.url).sent == 1
    later = [post_order(client, order(KEY)) for _ in range(5)]
    assert relay(db_url, sim.url).claimed == 0

    assert [r.status_code for r in first + later] == [201] + [200] * 9
    assert sim.attempts[KEY] == 1 and list(sim.executed) == [KEY]
    row = the_row(conn)
    assert (row["status"], row["attempts"], row["result_ref"]) == ("sent", 1, sim.executed[KEY]["broker_order_id"])
    assert len(rows(conn, TABLE)) == 1

    entry = the_entry(conn)
    assert entry["status"] == "succeeded"
    assert entry["result"]["broker_order_id"] == sim.executed[KEY]["broker_order_id"]
    assert entry["result_digest"] == result_digest(entry["result"])
    for replay in later:  # once executed, a replay answers the ExecResult
        assert replay.json() == entry["result"]


# -- DoD: 5xx → exponential backoff → final success ----------------------------------------------------
def test_5xx_is_retried_with_exponential_backoff_to_a_final_success(client, conn, db_url, broker_sim):
    sim = broker_sim(flaky_keys={KEY: 2})
    assert post_order(client, order(KEY)).status_code == 201
    retries, successes = dispatched("retry"), dispatched("success")

    delays = []
    for attempt in (1, 2):
        report = relay(db_url, sim.url)
        assert (report.claimed, report.retried) == (1, 1)
        row = the_row(conn)
        assert (row["status"], row["attempts"], row["last_error_code"]) == ("pending", attempt, "BROKER_5XX")
        assert "503" in row["last_error"]
        delays.append(backoff_s(conn))
        assert relay(db_url, sim.url).claimed == 0, "not due before its backoff"
        assert the_entry(conn)["status"] == "accepted"
        make_due(conn, TABLE)
    # The orders preset: 2 s, then 4 s, ±10 %.
    assert 1.8 <= delays[0] <= 2.2 and 3.6 <= delays[1] <= 4.4, delays

    assert relay(db_url, sim.url).sent == 1
    row = the_row(conn)
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("sent", 3, None)
    assert sim.attempts[KEY] == 3 and list(sim.executed) == [KEY]
    assert the_entry(conn)["status"] == "succeeded"

    assert audit_codes(conn, TABLE, row["id"]) == [
        "outbox_claim",
        "outbox_flush_retry",
        "outbox_claim",
        "outbox_flush_retry",
        "outbox_claim",
        "outbox_flush_success",
    ]
    transitions = conn.execute(
        "SELECT from_status, to_status, attempts, error_code, trace_id FROM outbox_audit "
        "WHERE message_id = %s ORDER BY id",
        (row["id"],),
    ).fetchall()
    assert [(t["from_status"], t["to_status"], t["attempts"]) for t in transitions] == [
        ("pending", "sending", 1),
        ("sending", "pending", 1),
        ("pending", "sending", 2),
        ("sending", "pending", 2),
        ("pending", "sending", 3),
        ("sending", "sent", 3),
    ]
    assert {t["trace_id"] for t in transitions} == {row["headers"]["trace_id"]}
    assert [t["error_code"] for t in transitions if t["to_status"] == "pending"] == ["BROKER_5XX", "BROKER_5XX"]
    assert dispatched("retry") - retries == 2 and dispatched("success") - successes == 1
    assert sample("outbox_dispatch_total", table=TABLE, result="retry") >= 2


# -- DoD: 400 → dead at once ---------------------------------------------------------------------------
def test_400_from_the_broker_is_dead_at_once_and_the_ledger_says_why(client, conn, db_url, broker_sim):
    sim = broker_sim(bad_keys={KEY})
    assert post_order(client, order(KEY)).status_code == 201
    dead_total = sample("outbox_dead_total", table=TABLE)

    report = relay(db_url, sim.url)
    assert (report.claimed, report.dead, report.dead_by_code) == (1, 1, {"BAD_REQUEST": 1})
    make_due(conn, TABLE)
    assert relay(db_url, sim.url).claimed == 0  # dead stays dead: no second attempt
    assert sim.attempts[KEY] == 1 and not sim.executed

    row = the_row(conn)
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("dead", 1, "BAD_REQUEST")
    assert audit_codes(conn, TABLE, row["id"]) == ["outbox_claim", "outbox_flush_dead"]
    entry = the_entry(conn)
    # Seed 001 error map: the broker's 400 is BROKER_REJECTED with that status (was BAD_REQUEST with 200).
    assert entry["status"] == "failed" and entry["reason"].startswith("BROKER_REJECTED: BAD_REQUEST: HTTP 400")
    assert entry["http_status"] == 400
    assert entry["response"]["error"] == "BROKER_REJECTED" and entry["response"]["reason_code"] == "BAD_REQUEST"
    assert entry["result"] is None and entry["result_digest"] is None
    status = client.get(f"/do/order/{KEY}").json()
    assert status["status"] == "failed" and status["reason"].startswith("BROKER_REJECTED")
    assert status["http_status"] == 400

    assert sample("outbox_dead_total", table=TABLE) - dead_total == 1
    exposition = metrics.exposition().decode()
    assert f'outbox_dead_total{{table="{TABLE}",topic=' in exposition
    assert sample("outbox_dispatch_total", table=TABLE, result="dead") >= 1


# -- 409 "already processed" counts as sent -------------------------------------------------------------
def test_409_already_processed_counts_as_sent_with_the_broker_order_id(client, conn, db_url, broker_sim):
    sim = broker_sim()
    body = order(KEY)
    assert post_order(client, body).status_code == 201
    # The broker executed the order, but the relay never heard the answer (lost on the way back).
    with httpx.Client(trust_env=False) as direct:
        lost = direct.post(sim.url, json=broker_request(body, KEY, None), headers={"Idempotency-Key": KEY})
    assert lost.status_code == 201
    broker_order_id = lost.json()["broker_order_id"]

    report = relay(db_url, sim.url)
    assert report.sent == 1
    row = the_row(conn)
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("sent", 1, "CONFLICT_PROCESSED")
    assert row["result_ref"] == broker_order_id
    assert sim.attempts[KEY] == 2 and len(sim.executed) == 1

    entry = the_entry(conn)
    assert entry["status"] == "succeeded"
    assert entry["result"]["broker_order_id"] == broker_order_id
    assert entry["result"]["status"] == "accepted"
    assert entry["result_digest"] == result_digest(entry["result"])
    assert audit_codes(conn, TABLE, row["id"]) == ["outbox_claim", "outbox_flush_success"]


# -- the broker request --------------------------------------------------------------------------------
def header(received, name: str) -> str:
    return {k.lower(): v for k, v in received.headers.items()}[name.lower()]


def test_the_broker_request_maps_the_order_and_every_attempt_carries_the_same_key(
    client, conn, db_url, http_sink, start_api
):
    http_sink.script = lambda key, attempt, body: (503, {}, b'{"error":"busy"}') if attempt == 1 else None
    limit = order(KEY, qty=1.13, price=145.001, time_in_force="GTC", tags=["pdca"], instrument="EURJPY", side="SELL")
    market = order("k-market", qty=0.1, price=None)
    assert post_order(client, limit, X_Trace_Id="do-outbox-01JB4A").status_code == 201
    assert post_order(client, market).status_code == 201
    token_api = start_api(tokens=("tok-path",))
    with token_api.client("tok-path") as scoped:
        assert post_order(scoped, order("k-scoped")).status_code == 201
    scoped_key = rows(conn, TABLE, "payload->>'idempotency_key' = 'k-scoped'")[0]["event_id"]
    assert scoped_key.endswith(":k-scoped") and scoped_key != "k-scoped"

    relay(db_url, http_sink.url)
    make_due(conn, TABLE)
    relay(db_url, http_sink.url)

    sent = {r["event_id"]: r for r in rows(conn, TABLE)}
    assert {k: (r["status"], r["attempts"]) for k, r in sent.items()} == {
        KEY: ("sent", 2),
        "k-market": ("sent", 2),
        scoped_key: ("sent", 2),
    }
    received = {}
    for request in http_sink.received:
        assert header(request, "Idempotency-Key") == request.body["idempotency_key"] == request.key
        received.setdefault(request.key, []).append(request.body)
    assert {k: len(v) for k, v in received.items()} == {KEY: 2, "k-market": 2, scoped_key: 2}
    for bodies in received.values():
        assert bodies[0] == bodies[1], "every attempt sends the same request"

    assert received[KEY][0] == {
        "idempotency_key": KEY,
        "symbol": "EURJPY",
        "intent": "SELL",
        "qty": 113_000,
        "limit_price": 145.001,
        "trace_id": "do-outbox-01JB4A",
        "meta": {"source": "DoLayer", "order_id": limit["order_id"], "time_in_force": "GTC", "tags": ["pdca"]},
    }
    market_request = received["k-market"][0]
    assert (market_request["qty"], market_request["limit_price"]) == (10_000, None)
    assert market_request["trace_id"] == sent["k-market"]["headers"]["trace_id"]
    assert received[scoped_key][0]["symbol"] == "USDJPY"


def test_broker_timeouts_follow_time_in_force(client, conn, db_url, broker_sim):
    assert broker_timeout_s(order(KEY, time_in_force="IOC")) == 2.5
    assert broker_timeout_s({k: v for k, v in order(KEY).items() if k != "time_in_force"}) == 2.5
    assert broker_timeout_s(order(KEY, time_in_force="FOK")) == 5.0
    assert broker_timeout_s(order(KEY, time_in_force="GTC")) == 5.0

    sim = broker_sim(every_nth_timeout=1, hang_s=3.0)  # every request answers after 3 s
    for key, tif in (("k-ioc", "IOC"), ("k-fok", "FOK"), ("k-gtc", "GTC")):
        assert post_order(client, order(key, time_in_force=tif)).status_code == 201
    started = time.monotonic()
    report = relay(db_url, sim.url)
    assert time.monotonic() - started < 5.0, "one batch: the three requests are in flight together"
    assert (report.sent, report.retried) == (2, 1)

    ioc = the_row(conn, "k-ioc")
    assert (ioc["status"], ioc["last_error_code"]) == ("pending", "NETWORK_TIMEOUT")
    assert "2.5" in ioc["last_error"]
    assert the_row(conn, "k-fok")["status"] == the_row(conn, "k-gtc")["status"] == "sent"

    sim.faults.every_nth_timeout = 0  # the broker recovers
    make_due(conn, TABLE)
    assert relay(db_url, sim.url).sent == 1
    ioc = the_row(conn, "k-ioc")
    assert ioc["status"] == "sent" and ioc["attempts"] == 2
    assert sorted(sim.executed) == ["k-fok", "k-gtc", "k-ioc"]  # each executed once
    assert the_entry(conn, "k-ioc")["status"] == "succeeded"


# -- the broker-sim command ----------------------------------------------------------------------------


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_broker_sim_command_serves_with_fault_injection():
    shown = run_cli(cli_env(), "broker-sim", "--help")
    assert shown.returncode == 0 and "--every-nth-5xx" in shown.stdout and "--bad-key" in shown.stdout

    port = free_port()
    process = start_cli(cli_env(), "broker-sim", "--port", str(port), "--every-nth-5xx", "2")
    try:
        wait_for_port(port, process)
        url = f"http://127.0.0.1:{port}/orders"
        with httpx.Client(trust_env=False, timeout=10) as client:

            def send(key: str) -> httpx.Response:
                return client.post(
                    url, json={"idempotency_key": key, "symbol": "USDJPY"}, headers={"Idempotency-Key": key}
                )

            control = f"http://127.0.0.1:{port}/_faults"
            for wrong in ({"every_nth_5xx": -1}, {"retry_after_s": -5}, {"flaky_keys": {"k": -2}}):
                refused = client.post(control, json=wrong)  # as the command line refuses them: nothing changes
                assert refused.status_code == 400 and "at least 0" in refused.json()["error"], refused.text
            assert client.get(f"http://127.0.0.1:{port}/_stats").json()["faults"]["every_nth_5xx"] == 2
            answers = [send("cli-a"), send("cli-b")]
            assert sorted(a.status_code for a in answers) == [201, 503]
            executed = next(a for a in answers if a.status_code == 201)
            again = send(executed.json()["idempotency_key"])
            assert again.status_code == 409
            assert again.json()["status"] == "already_processed"
            assert again.json()["broker_order_id"] == executed.json()["broker_order_id"]
    finally:
        _, out, err = stop_and_read(process, timeout_s=15)
    assert process.returncode is not None
    assert "every_nth_5xx=2" in out + err


def test_broker_sim_on_a_taken_port_says_so_without_its_listening_banner():
    """The banner says where it listens: printed only once it does, never before the error that it cannot."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(cli_env(), "broker-sim", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "broker simulator on" not in done.stdout + done.stderr


def test_a_failed_order_replays_as_failed_not_accepted(db_url, conn):
    """Reported by the API tests: the replay of a dead order must say failed, with the reason."""
    sim = BrokerSim(Faults(bad_keys={"bad-1"})).start_in_thread()
    try:
        order = order_payload(1, key="bad-1")
        with conn.transaction():
            accept_order(conn, "", order)
        destination = OrderBroker(sim.url)
        try:
            Relay(db_url, table_settings("outbox_orders", url=sim.url), destination).run(once=True)
        finally:
            destination.close()
        with conn.transaction():
            replay = accept_order(conn, "", order)
    finally:
        sim.stop()
    assert (replay.kind, ACCEPTANCE_STATUS[replay.kind]) == ("replay", 200)
    assert replay.response["status"] == "failed"
    assert replay.response["reason"].startswith("BROKER_REJECTED: BAD_REQUEST")
    assert (replay.response["error"], replay.response["http_status"]) == ("BROKER_REJECTED", 400)


def test_a_key_reused_after_the_ledger_forgot_it_is_refused(db_url, conn):
    with conn.transaction():
        accept_order(conn, "", order_payload(1, key="old-key"))
    conn.execute("DELETE FROM idempo_ledger")  # the cleaner removed it after 48 h; the sent row is kept 168 h
    with pytest.raises(KeyReused):
        with conn.transaction():
            accept_order(conn, "", order_payload(2, key="old-key"))
    assert conn.execute("SELECT count(*) AS n FROM idempo_ledger").fetchone()["n"] == 0


def test_the_ledger_reads_the_time_it_is_given(db_url, conn):
    """``now`` (a test moving database time) stamps the acceptance, the expiry and the settle alike."""
    at = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    with conn.transaction():
        accepted = accept_order(conn, "", order_payload(1, key="k-clock"), ttl_s=60, now=at)
    assert accepted.response["accepted_at"] == "2030-01-02T03:04:05.678Z"
    [entry] = ledger(conn)
    assert (entry["created_at"], entry["updated_at"], entry["expires_at"]) == (at, at, at + timedelta(seconds=60))
    settled_at = at + timedelta(minutes=5)
    record_outcomes(
        conn, [SettledOrder(entry["event_id"], "succeeded", {"status": "accepted"}, "sha256:x")], now=settled_at
    )
    [entry] = ledger(conn)
    assert (entry["status"], entry["created_at"], entry["updated_at"]) == ("succeeded", at, settled_at)


def test_a_key_whose_broker_key_another_caller_holds_is_refused(db_url, conn):
    """The broker sees '<scope>:<key>': an open-API key spelled like another caller's broker key was used."""
    with conn.transaction():
        accept_order(conn, "h:abc", order_payload(1, key="k-1"))
    with pytest.raises(KeyReused):
        with conn.transaction():
            accept_order(conn, "", order_payload(2, key="h:abc:k-1"))
    assert [e["idempotency_key"] for e in ledger(conn)] == ["k-1"]


def test_each_caller_scoped_order_settles_its_own_ledger_row_with_the_callers_key(db_url, conn):
    """Two callers, one key: the relay finds each ledger row by its message's event id ('<scope>:<key>'),
    and each ExecResult carries the key the caller sent, not the broker's."""
    with conn.transaction():
        accept_order(conn, "h:abc", order_payload(1, key="k-1"))
        accept_order(conn, "h:def", order_payload(2, key="k-1"))
    assert run_table_relay(db_url, paper_settings(), TABLE, once=True).sent == 2
    entries = {e["scope"]: e for e in ledger(conn)}
    for scope in ("h:abc", "h:def"):
        entry = entries[scope]
        assert (entry["status"], entry["http_status"], entry["event_id"]) == ("succeeded", 200, f"{scope}:k-1")
        assert entry["result"]["idempotency_key"] == "k-1" and entry["result_digest"] == result_digest(entry["result"])
        assert entry["result"]["broker_order_id"] == the_row(conn, f"{scope}:k-1")["result_ref"]
