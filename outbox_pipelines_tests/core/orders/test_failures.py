"""Seed 001's error map in idempo_ledger: a client can tell an outage from a rejection.

A dead order is stored ``failed`` with seed 001's code, the HTTP status of the failure and
the reason; ``GET /do/order/{key}`` and a replay of the POST show them:

| what happened | code | http_status |
|---|---|---|
| the broker answered 4xx (400, 401, 404, 409 ...) | BROKER_REJECTED | that status |
| never sent: the request could not be built / the client refused it | BROKER_REJECTED | 400 |
| gave up after timeouts (or the broker's 408 / 504) | BROKER_TIMEOUT | 504 (408 / 504) |
| gave up after connection errors | BROKER_DOWN | 503 |
| gave up after 5xx | BROKER_DOWN | the broker's 5xx |
| gave up after unusable answers | BROKER_DOWN | 502 |

Real sockets: the broker is an http_sink with scripted answers or the broker simulator;
the relay is the product's run_table_relay; the Order API is served by uvicorn.
"""

import dataclasses

import pytest

from outbox_pipelines.core import models as m
from outbox_pipelines.core.relay import run_table_relay
from outbox_pipelines.core.settings import Settings, load_settings
from outbox_pipelines.orders.broker_sim import BrokerSim, Faults
from outbox_pipelines.orders.failures import (
    BROKER_DOWN,
    BROKER_REJECTED,
    BROKER_TIMEOUT,
    INTERNAL_ERROR,
    failure_code,
)
from outbox_pipelines_tests.api.conftest import ApiServers
from outbox_pipelines_tests.helpers import accept_order, order_payload
from outbox_pipelines_tests.processes import free_port
from outbox_pipelines_tests.rows import make_due

TABLE = "outbox_orders"


def settings_for(url: str, max_attempts: int = 2) -> Settings:
    settings = load_settings(env={"OUTBOX_BROKER_URL": url}, path=None)
    table = settings.table(TABLE)
    table = dataclasses.replace(table, retry=table.retry.with_overrides(max_attempts=max_attempts))
    return dataclasses.replace(settings, tables={**settings.tables, TABLE: table})


def accept(conn, *keys: str, **fields) -> None:
    with conn.transaction():
        for i, key in enumerate(keys, start=1):
            accept_order(conn, "", {**order_payload(i, key), **fields})


def relay_until_settled(conn, db_url: str, settings: Settings, passes: int = 3) -> None:
    """Relay passes with time moved forward between them (no sleeping through backoffs)."""
    for _ in range(passes):
        run_table_relay(db_url, settings, TABLE, once=True)
        make_due(conn, TABLE)


def entry(conn, key: str) -> dict:
    return conn.execute("SELECT * FROM idempo_ledger WHERE scope = '' AND idempotency_key = %s", (key,)).fetchone()


def assert_failed(conn, key: str, code: str, http_status: int, reason_code: str) -> dict:
    found = entry(conn, key)
    assert (found["status"], found["http_status"]) == ("failed", http_status), found
    assert found["reason"].startswith(f"{code}: {reason_code}: "), found["reason"]
    response = found["response"]
    assert (response["status"], response["error"], response["http_status"], response["reason_code"]) == (
        "failed",
        code,
        http_status,
        reason_code,
    )
    assert response["reason"] == found["reason"] and response["idempotency_key"] == key
    assert found["result"] is None and found["result_digest"] is None
    return found


# -- over real HTTP -----------------------------------------------------------------------------------

SCRIPTED = {
    "k-400": (400, b'{"error": "qty below minimum"}'),
    "k-401": (401, b""),
    "k-404": (404, b"no such route"),
    "k-409": (409, b'{"error": "IDEMPOTENCY_CONFLICT"}'),
    "k-422": (422, b'{"error": "instrument halted"}'),
    "k-502": (502, b"bad gateway"),
    "k-503": (503, b"maintenance"),
    "k-504": (504, b"gateway timeout"),
}


def test_each_failure_is_stored_with_the_seed_001_code_and_status(conn, db_url, http_sink):
    http_sink.script = lambda key, attempt, body: (
        (SCRIPTED[key][0], {"Content-Type": "application/json"}, SCRIPTED[key][1]) if key in SCRIPTED else None
    )
    accept(conn, *SCRIPTED, "k-ok")
    relay_until_settled(conn, db_url, settings_for(http_sink.url))

    for key in ("k-400", "k-404", "k-409", "k-422"):
        found = assert_failed(conn, key, BROKER_REJECTED, SCRIPTED[key][0], "BAD_REQUEST")
        assert http_sink.counts[key] == 1, "a rejection is not retried"
        # our words and the status; never the broker's own text (issue 22: it may quote echoed credentials)
        assert found["reason"] == f"BROKER_REJECTED: BAD_REQUEST: HTTP {SCRIPTED[key][0]}, the broker refused the order"
        assert SCRIPTED[key][1].decode()[:8] not in found["reason"]
    assert_failed(conn, "k-401", BROKER_REJECTED, 401, "UNAUTHORIZED")
    # Outages: retried to max attempts (2 here), then the code says the broker was down or slow.
    for key in ("k-502", "k-503"):
        found = assert_failed(conn, key, BROKER_DOWN, SCRIPTED[key][0], "BROKER_5XX")
        assert "gave up after 2 attempts" in found["reason"] and http_sink.counts[key] == 2
    assert_failed(conn, "k-504", BROKER_TIMEOUT, 504, "BROKER_5XX")

    ok = entry(conn, "k-ok")
    assert (ok["status"], ok["http_status"], ok["reason"]) == ("succeeded", 200, None)


def test_gave_up_after_timeouts_is_broker_timeout(conn, db_url):
    sim = BrokerSim(Faults(every_nth_timeout=1, hang_s=3.0)).start_in_thread()  # IOC gives up after 2.5 s
    try:
        accept(conn, "k-slow")
        relay_until_settled(conn, db_url, settings_for(sim.url), passes=2)
    finally:
        sim.stop()
    found = assert_failed(conn, "k-slow", BROKER_TIMEOUT, 504, "NETWORK_TIMEOUT")
    assert "no answer from the broker in time" in found["reason"]


def test_gave_up_after_connection_errors_is_broker_down(conn, db_url):
    closed = f"http://127.0.0.1:{free_port()}/orders"
    accept(conn, "k-unreachable")
    relay_until_settled(conn, db_url, settings_for(closed), passes=2)
    found = assert_failed(conn, "k-unreachable", BROKER_DOWN, 503, "CONNECTION_REFUSED")
    assert "could not be reached (connection failed)" in found["reason"]


def test_an_order_the_broker_mapping_cannot_send_is_rejected_before_the_broker(conn, db_url, http_sink):
    accept(conn, "k-unmappable")
    # The stored order lost a field the broker request needs (as a hand-edited row would).
    conn.execute(f"UPDATE {TABLE} SET payload = payload - 'instrument'")
    relay_until_settled(conn, db_url, settings_for(http_sink.url), passes=1)
    found = assert_failed(conn, "k-unmappable", BROKER_REJECTED, 400, "BAD_REQUEST")
    assert "nothing reached the broker" in found["reason"] and http_sink.received == []


def test_get_and_replay_tell_an_outage_from_a_rejection(conn, db_url, http_sink):
    http_sink.script = lambda key, attempt, body: (400, {}, b"rejected") if key == "k-rejected" else (503, {}, b"down")
    accept(conn, "k-rejected", "k-outage")
    relay_until_settled(conn, db_url, settings_for(http_sink.url))

    servers = ApiServers(db_url)
    api = servers.start()
    try:
        with api.client() as client:
            rejected = client.get("/do/order/k-rejected").json()
            outage = client.get("/do/order/k-outage").json()
            replay = client.post(
                "/do/order", json=order_payload(2, "k-outage"), headers={"Idempotency-Key": "k-outage"}
            )
    finally:
        servers.stop_all()
    assert (rejected["status"], rejected["http_status"]) == ("failed", 400)
    assert rejected["reason"].startswith("BROKER_REJECTED: BAD_REQUEST: HTTP 400")
    assert (outage["status"], outage["http_status"]) == ("failed", 503)
    assert outage["reason"] == (
        "BROKER_DOWN: BROKER_5XX: HTTP 503, the broker failed or answered what could not be "
        "used; gave up after 2 attempts"
    )
    assert replay.status_code == 200
    answer = replay.json()
    assert (answer["status"], answer["error"], answer["http_status"]) == ("failed", BROKER_DOWN, 503)


def test_a_broker_answer_after_a_failure_still_succeeds_with_200(conn, db_url):
    sim = BrokerSim(Faults(flaky_keys={"k-flaky": 1})).start_in_thread()
    try:
        accept(conn, "k-flaky")
        relay_until_settled(conn, db_url, settings_for(sim.url), passes=2)
    finally:
        sim.stop()
    found = entry(conn, "k-flaky")
    assert (found["status"], found["http_status"], found["reason"]) == ("succeeded", 200, None)
    assert found["response"]["broker_order_id"] == sim.executed["k-flaky"]["broker_order_id"]


# -- the map itself, row by row (also when the last attempt was made by another process) ----------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # What the last attempt saw on the wire.
        ((m.BAD_REQUEST, "HTTP 400: 'x'", 400, None), (BROKER_REJECTED, 400)),
        ((m.BAD_REQUEST, "HTTP 409 without 'already processed'", 409, None), (BROKER_REJECTED, 409)),
        ((m.BAD_REQUEST, "HTTP 413: ''", 413, None), (BROKER_REJECTED, 413)),
        ((m.UNAUTHORIZED, "HTTP 403: check", 403, None), (BROKER_REJECTED, 403)),
        ((m.BAD_REQUEST, "the HTTP client refused to send the request: ...", None, "refused"), (BROKER_REJECTED, 400)),
        (
            (m.NETWORK_TIMEOUT, "gave up after 8 of 8 attempts: no answer within 2.5 s", None, "timeout"),
            (BROKER_TIMEOUT, 504),
        ),
        ((m.NETWORK_TIMEOUT, "gave up ...: HTTP 408 request timeout", 408, None), (BROKER_TIMEOUT, 408)),
        ((m.BROKER_5XX, "gave up ...: HTTP 504: ''", 504, None), (BROKER_TIMEOUT, 504)),
        ((m.NETWORK_TIMEOUT, "gave up ...: connection failed: ConnectError", None, "connection"), (BROKER_DOWN, 503)),
        ((m.BROKER_5XX, "gave up ...: HTTP 500: 'boom'", 500, None), (BROKER_DOWN, 500)),
        ((m.BROKER_5XX, "gave up ...: HTTP 503: ''", 503, None), (BROKER_DOWN, 503)),
        (
            (m.UNKNOWN, "gave up ...: HTTP 200 with a body that is not the JSON it declares", 200, None),
            (BROKER_DOWN, 502),
        ),
        ((m.UNKNOWN, "gave up ...: unusable answer: RemoteProtocolError", None, "protocol"), (BROKER_DOWN, 502)),
        # No attempt seen by this process: the outbox code and the error text decide.
        ((m.BAD_REQUEST, "HTTP 404: 'no route'", None, None), (BROKER_REJECTED, 404)),
        ((m.BAD_REQUEST, "cannot build the request: KeyError: 'instrument'", None, None), (BROKER_REJECTED, 400)),
        ((m.UNAUTHORIZED, "HTTP 401: check the destination's credentials", None, None), (BROKER_REJECTED, 401)),
        (
            (m.NETWORK_TIMEOUT, "gave up after 8 of 8 attempts: no answer within 5 s (ReadTimeout)", None, None),
            (BROKER_TIMEOUT, 504),
        ),
        (
            (m.NETWORK_TIMEOUT, "gave up after 8 of 8 attempts: connection failed: ConnectError", None, None),
            (BROKER_DOWN, 503),
        ),
        ((m.BROKER_5XX, "gave up after 8 of 8 attempts: HTTP 502: 'bad gateway'", None, None), (BROKER_DOWN, 502)),
        ((m.UNKNOWN, "gave up after 8 of 8 attempts: unusable answer", None, None), (BROKER_DOWN, 502)),
        (("DB_ERROR", "the settle failed", None, None), (INTERNAL_ERROR, 500)),
    ],
)
def test_the_error_map_row_by_row(args, expected):
    assert failure_code(*args) == expected
