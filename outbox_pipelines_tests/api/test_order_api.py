"""The Order API of seed 001 over real HTTP, checked in the database too.

Every row of the seed's response table: 201 first time, 200 identical replay,
409 same key + different body, 422 key mismatch / invalid order (every
violation), 429 with Retry-After; plus the guards a user relies on (bearer
tokens scoping keys, body limit, content type, malformed JSON) — and nothing
stored for any rejected request.
"""

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from outbox_pipelines.core.relay import run_table_relay
from outbox_pipelines.orders.model import request_digest, result_digest
from outbox_pipelines_tests.api.conftest import (
    ApiServers,
    LiveApi,
    assert_error,
    assert_nothing_stored,
    ledger,
    order,
    paper_settings,
    post_order,
    post_raw,
    raw,
)
from outbox_pipelines_tests.helpers import rows

KEY = "01JABCXYZ-ULID-5678"


# -- 201 / 200 / 409 ---------------------------------------------------------------------------------
def test_first_post_is_201_with_the_ledger_row_and_one_outbox_row_in_the_same_commit(client, conn):
    body = order(KEY, price=None, tags=["pdca", "recheck"])
    response = post_order(client, body, X_Trace_Id="do-trace-0001")

    assert response.status_code == 201, response.text
    assert response.headers["x-trace-id"] == "do-trace-0001"
    ack = response.json()
    assert ack["status"] == "accepted" and ack["idempotency_key"] == KEY and ack["order_id"] == body["order_id"]
    assert ack["request_digest"] == request_digest(body)

    [entry] = ledger(conn)
    assert (entry["idempotency_key"], entry["scope"], entry["status"], entry["http_status"]) == (
        KEY,
        "",
        "accepted",
        201,
    )
    assert entry["request_digest"] == ack["request_digest"] and entry["response"] == ack
    assert 47.9 * 3600 < (entry["expires_at"] - entry["created_at"]).total_seconds() <= 48 * 3600

    [row] = rows(conn, "outbox_orders")
    assert row["event_id"] == KEY and row["status"] == "pending" and row["attempts"] == 0
    assert row["payload"] == body  # already normalized: every default present
    assert row["payload_sha"] == entry["request_digest"]
    assert row["headers"] == {"trace_id": "do-trace-0001"}
    assert entry["event_id"] == row["event_id"]  # the ledger row names the message that carries its order
    # Ledger row and outbox row were written by one transaction.
    same_tx = conn.execute(
        "SELECT (SELECT xmin::text FROM idempo_ledger) = (SELECT xmin::text FROM outbox_orders) AS same"
    ).fetchone()
    assert same_tx["same"]


def test_the_stored_order_is_normalized_time_in_force_defaults_to_ioc(client, conn):
    body = order("k-defaults")
    for name in ("time_in_force", "price", "tags"):
        del body[name]
    response = post_order(client, body)
    assert response.status_code == 201, response.text

    [row] = rows(conn, "outbox_orders")
    assert row["payload"] == {**body, "time_in_force": "IOC", "price": None, "tags": []}
    trace = response.headers["x-trace-id"]
    assert trace.startswith("do-") and row["headers"]["trace_id"] == trace
    # Omitting a default and sending it are the same request: a replay, not a conflict.
    again = post_order(client, {**body, "time_in_force": "IOC", "price": None, "tags": []})
    assert again.status_code == 200 and again.json() == response.json()


def test_identical_replay_is_200_with_the_stored_answer_and_stores_nothing_new(client, conn):
    first = post_order(client, order(KEY))
    replays = [post_order(client, order(KEY)) for _ in range(3)]
    # Key order and whitespace do not matter: the digest is of canonical JSON.
    reordered = post_raw(client, json.dumps(dict(reversed(list(order(KEY).items()))), indent=2).encode(), KEY)

    assert first.status_code == 201
    for replay in [*replays, reordered]:
        assert replay.status_code == 200, replay.text
        assert replay.json() == first.json()
    assert len(ledger(conn)) == 1 and len(rows(conn, "outbox_orders")) == 1


def test_same_key_with_a_different_body_is_409_and_nothing_new_is_stored(client, conn):
    assert post_order(client, order(KEY, qty=0.1)).status_code == 201
    before_ledger, before_rows = ledger(conn), rows(conn, "outbox_orders")

    for changed in (
        order(KEY, qty=0.2),
        order(KEY, side="SELL"),
        order(KEY, time_in_force="GTC"),
        order(KEY, tags=["x"]),
    ):
        body = assert_error(post_order(client, changed), 409, "IDEMPOTENCY_CONFLICT")
        assert body["idempotency_key"] == KEY

    assert ledger(conn) == before_ledger and rows(conn, "outbox_orders") == before_rows
    # The original is still what a replay returns.
    assert post_order(client, order(KEY, qty=0.1)).status_code == 200


# -- 422 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header_key", "why"),
    [
        (None, "no header"),
        ("", "empty header"),
        ("other-key", "different key"),
        (KEY.lower(), "keys are case-sensitive"),
    ],
)
def test_header_and_body_keys_must_match_422_idempotency_mismatch(client, conn, header_key, why):
    response = post_order(client, order(KEY), key=header_key)
    assert_error(response, 422, "IDEMPOTENCY_MISMATCH")
    assert_nothing_stored(conn)


def test_a_body_without_a_key_is_422_idempotency_mismatch(client, conn):
    body = order(KEY)
    del body["idempotency_key"]
    assert_error(post_order(client, body, key=KEY), 422, "IDEMPOTENCY_MISMATCH")
    assert_nothing_stored(conn)


def violations(response) -> dict[str, str]:
    body = assert_error(response, 422, "VALIDATION_ERROR")
    found = {v["field"]: v["message"] for v in body["violations"]}
    assert len(found) == len(body["violations"]), "one violation per field"
    return found


def test_validation_error_lists_every_violation_at_once(client, conn):
    bad = order(
        KEY,
        instrument="BTCUSD",
        side="HOLD",
        qty=0.123,
        price=-1,
        time_in_force="DAY",
        requested_at="yesterday",
        risk_constraints={"max_dd": 1.5, "max_consecutive_loss": -1, "max_spread": 0, "max_leverage": 10},
        tags="not-a-list",
        colour="red",
    )
    found = violations(post_order(client, bad))
    assert set(found) == {
        "instrument",
        "side",
        "qty",
        "price",
        "time_in_force",
        "requested_at",
        "tags",
        "colour",
        "risk_constraints.max_dd",
        "risk_constraints.max_consecutive_loss",
        "risk_constraints.max_spread",
        "risk_constraints.max_leverage",
    }
    assert found["colour"] == "unknown field" and found["risk_constraints.max_leverage"] == "unknown field"
    assert "lot step" in found["qty"] and "USDJPY" in found["instrument"]
    assert_nothing_stored(conn)


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"instrument": "XAUUSD"}, "instrument", "must be one of"),
        ({"instrument": "usdjpy"}, "instrument", "must be one of"),
        ({"qty": 0.015}, "qty", "lot step"),
        ({"qty": 0.005}, "qty", "minimum lot"),
        ({"qty": 0}, "qty", "minimum lot"),
        ({"qty": -0.1}, "qty", "minimum lot"),
        ({"qty": 100.01}, "qty", "at most"),
        ({"qty": "0.1"}, "qty", "number"),
        ({"qty": True}, "qty", "number"),
        ({"qty": raw("1e400")}, "qty", "number"),
        ({"side": "buy"}, "side", "BUY or SELL"),
        ({"time_in_force": "DAY"}, "time_in_force", "IOC, FOK or GTC"),
        ({"price": 0}, "price", "positive"),
        ({"price": -145.0}, "price", "positive"),
        ({"price": "145.0"}, "price", "positive"),
        ({"price": raw("1e400")}, "price", "positive"),
        ({"requested_at": "2025-08-24T00:00:00"}, "requested_at", "zone"),
        ({"requested_at": "not a time"}, "requested_at", "RFC 3339"),
        ({"requested_at": 1724457600}, "requested_at", "RFC 3339"),
        ({"requested_at": "2999-01-01T00:00:00Z"}, "requested_at", "future"),
        ({"risk_constraints": {"max_dd": 0}}, "risk_constraints.max_dd", "(0, 1]"),
        ({"risk_constraints": {"max_consecutive_loss": 1001}}, "risk_constraints.max_consecutive_loss", "0 to 1000"),
        ({"risk_constraints": {"max_consecutive_loss": 2.5}}, "risk_constraints.max_consecutive_loss", "whole number"),
        ({"risk_constraints": {"max_spread": raw("1e400")}}, "risk_constraints.max_spread", "positive"),
        ({"risk_constraints": []}, "risk_constraints", "object"),
        ({"order_id": "has space"}, "order_id", "characters"),
        ({"order_id": None}, "order_id", "required"),
        ({"tags": ["x" * 33]}, "tags", "strings"),
        ({"tags": ["t"] * 17}, "tags", "at most 16"),
        ({"unexpected": 1}, "unexpected", "unknown field"),
        ({"note": "nul \u0000 inside"}, "note", "unknown field"),
        ({"tags": ["nul\u0000"]}, "$", "\\u0000"),
    ],
)
def test_each_invalid_field_is_422_validation_error_naming_it(client, conn, fields, field, says):
    found = violations(post_order(client, order(KEY, **fields)))
    assert field in found, found
    assert says in found[field], found
    assert_nothing_stored(conn)


@pytest.mark.parametrize(
    "fields",
    [
        {"price": None, "time_in_force": "IOC"},  # a market order
        {"price": 145.001, "time_in_force": "GTC"},
        {"qty": 0.01, "time_in_force": "FOK"},
        {"qty": 100},
        {"qty": 1.13},
        {"risk_constraints": {"max_dd": 0.1, "max_consecutive_loss": 3, "max_spread": 0.002}},
        {"requested_at": "2025-08-24T09:00:00+09:00"},
        {"instrument": "EURUSD", "side": "SELL"},
    ],
)
def test_valid_variants_are_accepted(client, conn, fields):
    response = post_order(client, order(KEY, **fields))
    assert response.status_code == 201, response.text
    [row] = rows(conn, "outbox_orders")
    assert row["payload"] == order(KEY, **fields)


def test_the_seed_example_order_is_accepted(client, conn):
    seed_example = {
        "order_id": "ord-20250824-0001",
        "instrument": "USDJPY",
        "side": "BUY",
        "qty": 0.10,
        "price": None,
        "time_in_force": "IOC",
        "tags": ["pdca", "recheck"],
        "idempotency_key": "01JABCXYZ-ULID-5678",
        "requested_at": "2025-08-24T00:00:00Z",
        "risk_constraints": {"max_dd": 0.1, "max_consecutive_loss": 3, "max_spread": 0.002},
    }
    assert post_order(client, seed_example).status_code == 201
    assert rows(conn, "outbox_orders")[0]["payload"] == seed_example


def test_keys_over_128_characters_are_rejected(client, conn):
    long_key = "K" * 129
    found = violations(post_order(client, order(long_key)))
    assert set(found) == {"idempotency_key"}
    assert_error(post_order(client, order("K" * 128), key=long_key), 422, "IDEMPOTENCY_MISMATCH")
    assert post_order(client, order("K" * 128)).status_code == 201  # 128 is the limit, not over it
    assert len(ledger(conn)) == 1


# -- 429 -----------------------------------------------------------------------------------------------
def exhaust(client: httpx.Client, n: int, **headers: str) -> None:
    """Spend ``n`` requests of the rate limit on GETs (they count, and store nothing)."""
    for _ in range(n):
        response = client.get("/do/order/unknown-key", headers=headers)
        assert response.status_code == 404, response.text


def assert_rate_limited(response: httpx.Response, per_minute: int) -> None:
    body = assert_error(response, 429, "RATE_LIMITED")
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= 60 / per_minute + 1
    assert body["retry_after"] == retry_after


def test_over_the_rate_limit_is_429_with_retry_after_and_nothing_stored(start_api, conn):
    api = start_api(rate_per_minute=5)
    with api.client() as client:
        exhaust(client, 5)
        assert_rate_limited(post_order(client, order(KEY)), 5)
        assert_rate_limited(client.get(f"/do/order/{KEY}"), 5)
        # A made-up X-Forwarded-For from an untrusted peer is ignored: still the same client.
        assert_rate_limited(post_order(client, order(KEY), X_Forwarded_For="203.0.113.7"), 5)
        assert_rate_limited(post_order(client, order(KEY), X_Forwarded_For="198.51.100.1, 203.0.113.8"), 5)
        # Health and metrics are not rate limited.
        assert client.get("/healthz").status_code == 200
    assert_nothing_stored(conn)


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit(start_api, conn):
    api = start_api(rate_per_minute=5, trusted_proxies=("127.0.0.0/8",))
    with api.client() as client:
        alice = {"X-Forwarded-For": "203.0.113.7"}
        exhaust(client, 5, **alice)
        assert_rate_limited(client.get("/do/order/k", headers=alice), 5)
        # The proxy appends the real client last; what the client wrote before it does not count.
        assert_rate_limited(client.get("/do/order/k", headers={"X-Forwarded-For": "10.9.9.9, 203.0.113.7"}), 5)
        bob = {"X-Forwarded-For": "203.0.113.8"}
        assert post_order(client, order(KEY), X_Forwarded_For="203.0.113.8").status_code == 201
        exhaust(client, 4, **bob)
        assert_rate_limited(client.get("/do/order/k", headers=bob), 5)
    assert len(ledger(conn)) == 1


# -- bearer tokens -------------------------------------------------------------------------------------
@pytest.fixture
def token_api(start_api) -> LiveApi:
    return start_api(tokens=("token-alpha", "token-bravo"))


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", "Bearer", "Basic dG9rZW4tYWxwaGE6", "token-alpha", "Bearer token-alph"],
)
def test_without_a_valid_bearer_token_it_is_401_and_nothing_is_stored(token_api, conn, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    with token_api.client() as client:
        for response in (post_order(client, order(KEY), **headers), client.get(f"/do/order/{KEY}", headers=headers)):
            assert_error(response, 401, "UNAUTHORIZED")
            assert response.headers["www-authenticate"] == "Bearer"
        assert client.get("/healthz").status_code == 200
    assert_nothing_stored(conn)


def test_two_tokens_with_the_same_key_get_two_independent_orders(token_api, conn):
    with token_api.client("token-alpha") as alpha, token_api.client("token-bravo") as bravo:
        a = post_order(alpha, order(KEY, qty=0.1))
        b = post_order(bravo, order(KEY, qty=0.5))  # a different body: not a conflict, another caller
        assert (a.status_code, b.status_code) == (201, 201), (a.text, b.text)
        assert post_order(alpha, order("only-alpha")).status_code == 201

        assert alpha.get(f"/do/order/{KEY}").json()["request_digest"] == a.json()["request_digest"]
        assert bravo.get(f"/do/order/{KEY}").json()["request_digest"] == b.json()["request_digest"]
        assert_error(bravo.get("/do/order/only-alpha"), 404, "NOT_FOUND")
        assert post_order(alpha, order(KEY, qty=0.1)).status_code == 200
        assert post_order(bravo, order(KEY, qty=0.1)).status_code == 409

    entries = ledger(conn)
    assert sorted(e["idempotency_key"] for e in entries) == [KEY, KEY, "only-alpha"]
    assert len({e["scope"] for e in entries}) == 2 and "" not in {e["scope"] for e in entries}
    outbox = rows(conn, "outbox_orders")
    assert len(outbox) == 3 and len({r["event_id"] for r in outbox}) == 3
    assert {r["event_id"] for r in outbox} == {e["event_id"] for e in entries}
    for entry in entries:  # the broker sees the key qualified by its caller
        assert entry["event_id"] == f"{entry['scope']}:{entry['idempotency_key']}"
    for row in outbox:
        assert "token-alpha" not in json.dumps(row["headers"]) and "token-bravo" not in row["event_id"]


# -- 413 / 415 / 400 and hostile input -----------------------------------------------------------------
def test_a_body_over_the_limit_is_413_declared_or_streamed(start_api, conn):
    api = start_api(max_body_bytes=1024)
    big = order(KEY, tags=["x" * 32] * 16, order_id="o" * 64)
    big["pad"] = "p" * 2000
    with api.client() as client:
        assert_error(post_order(client, big), 413, "PAYLOAD_TOO_LARGE")

        def chunks():  # no Content-Length: chunked transfer encoding
            for _ in range(40):
                yield b" " * 64
            yield json.dumps(order(KEY)).encode()

        streamed = client.post(
            "/do/order", content=chunks(), headers={"Content-Type": "application/json", "Idempotency-Key": KEY}
        )
        assert "content-length" not in streamed.request.headers
        assert_error(streamed, 413, "PAYLOAD_TOO_LARGE")
        assert_nothing_stored(conn)
        assert post_order(client, order(KEY)).status_code == 201  # a normal order fits


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/jsonx", None])
def test_a_wrong_content_type_is_415(client, conn, content_type):
    headers = {"Idempotency-Key": KEY}
    if content_type:
        headers["Content-Type"] = content_type
    response = client.post("/do/order", content=json.dumps(order(KEY)).encode(), headers=headers)
    assert_error(response, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert_nothing_stored(conn)


def test_json_with_a_charset_parameter_is_fine(client, conn):
    response = post_raw(client, json.dumps(order(KEY)).encode(), KEY, content_type="Application/JSON; charset=utf-8")
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b'{"idempotency_key": "k"',
        b"\xff\xfe{}",
        '{"order_id": "caf\u00e9"}'.encode("latin-1"),
        b'{"qty": NaN}',
        b'{"qty": Infinity}',
        b'{"qty": -Infinity}',
        b'{"qty": ' + b"9" * 5000 + b"}",
        b"[" * 5000 + b"]" * 5000,
        b'{"tags": ["\\ud800"]}',
        b'{"order_id": "\\udfff-x"}',
        b"{'single': 'quotes'}",
    ],
    ids=[
        "empty",
        "truncated",
        "unterminated",
        "invalid-utf8",
        "latin1",
        "nan",
        "inf",
        "-inf",
        "5000-digits",
        "deep-nesting",
        "lone-high-surrogate",
        "lone-low-surrogate",
        "single-quotes",
    ],
)
def test_malformed_json_is_400_never_5xx(client, conn, content):
    assert_error(post_raw(client, content, "k"), 400, "MALFORMED_JSON")
    assert_nothing_stored(conn)


def test_a_key_given_twice_or_a_compressed_body_is_refused_and_nothing_stored(client, conn):
    """Parsers disagree on a repeated key (the first or the last counts): the order executed and the one its
    idempotency digest stands for could differ. A Content-Encoding is never decoded here: refused, not misread."""
    twice = json.dumps(order("dup-1"))[:-1].encode() + b', "qty": 100}'
    refused = post_raw(client, twice, "dup-1")
    assert_error(refused, 400, "MALFORMED_JSON")
    assert "'qty' twice" in refused.text
    gzipped = post_raw(client, json.dumps(order("gz-1")).encode(), "gz-1", **{"Content-Encoding": "gzip"})
    assert_error(gzipped, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert_nothing_stored(conn)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ([order(KEY)], 422, "IDEMPOTENCY_MISMATCH"),
        ("a string", 422, "IDEMPOTENCY_MISMATCH"),
        (None, 422, "IDEMPOTENCY_MISMATCH"),
        ({"idempotency_key": KEY}, 422, "VALIDATION_ERROR"),
        ({"idempotency_key": KEY, "x" * 10_000: 1}, 422, "VALIDATION_ERROR"),
        (
            {"idempotency_key": KEY, "qty": raw("1e400"), "price": raw("-1e400"), "n": raw("1e400")},
            422,
            "VALIDATION_ERROR",
        ),
        ({**order(KEY), "qty": 10**4000}, 422, "VALIDATION_ERROR"),
        ({**order(KEY), "nested": {"\u0000key": "\u0000"}}, 422, "VALIDATION_ERROR"),
    ],
    ids=["array", "string", "null", "only-key", "long-field-name", "huge-floats", "huge-int-qty", "nul-in-keys"],
)
def test_hostile_bodies_get_their_documented_4xx(client, conn, body, status, code):
    response = post_order(client, body, key=KEY)
    error = assert_error(response, status, code)
    for violation in error.get("violations", []):
        assert len(violation["field"]) <= 64
    assert_nothing_stored(conn)


# -- 50 at once ----------------------------------------------------------------------------------------
def test_fifty_concurrent_identical_posts_give_one_201_and_49_replays(api, conn):
    body = json.dumps(order(KEY)).encode()

    async def storm() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
        async with httpx.AsyncClient(base_url=api.url, limits=limits, timeout=30, trust_env=False) as client:
            start = asyncio.Event()

            async def one() -> httpx.Response:
                await start.wait()
                return await client.post(
                    "/do/order", content=body, headers={"Content-Type": "application/json", "Idempotency-Key": KEY}
                )

            tasks = [asyncio.create_task(one()) for _ in range(50)]
            await asyncio.sleep(0)
            start.set()
            return await asyncio.gather(*tasks)

    responses = asyncio.run(storm())
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 49 + [201], codes
    assert len({json.dumps(r.json(), sort_keys=True) for r in responses}) == 1  # everyone got the same answer
    assert len(ledger(conn)) == 1
    assert len(rows(conn, "outbox_orders")) == 1


# -- GET /do/order/{key}, after the relay; /healthz; /metrics ------------------------------------------
def test_get_order_follows_the_order_from_accepted_to_succeeded(client, conn, db_url):
    assert_error(client.get(f"/do/order/{KEY}"), 404, "NOT_FOUND")
    assert_error(client.get("/do/order/" + "k" * 200), 404, "NOT_FOUND")
    ack = post_order(client, order(KEY)).json()

    accepted = client.get(f"/do/order/{KEY}")
    assert accepted.status_code == 200
    status = accepted.json()
    assert status["status"] == "accepted" and status["http_status"] == 201
    assert status["request_digest"] == ack["request_digest"] and status["result"] is None

    report = run_table_relay(db_url, paper_settings(), "outbox_orders", once=True)
    assert report.sent == 1

    succeeded = client.get(f"/do/order/{KEY}").json()
    assert succeeded["status"] == "succeeded" and succeeded["http_status"] == 200
    result = succeeded["result"]
    assert result["status"] == "accepted" and result["idempotency_key"] == KEY
    assert result["broker_order_id"].startswith("paper-") and result["fills"] == []
    assert succeeded["result_digest"] == result_digest(result)
    [row] = rows(conn, "outbox_orders")
    assert row["status"] == "sent" and row["result_ref"] == result["broker_order_id"]

    replay = post_order(client, order(KEY))
    assert replay.status_code == 200 and replay.json() == result  # the ExecResult, once executed
    assert_error(post_order(client, order(KEY, qty=0.2)), 409, "IDEMPOTENCY_CONFLICT")


def scrape(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_healthz_and_metrics(client, conn, db_url):
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}

    before = scrape(client)
    created = ("order_requests_total", (("status", "201"),))
    conflicts = ("order_idempotency_conflicts_total", ())
    pending = ("outbox_pending_count", (("table", "outbox_orders"),))
    assert before[pending] == 0

    assert post_order(client, order(KEY)).status_code == 201
    assert post_order(client, order("k-2")).status_code == 201
    assert post_order(client, order(KEY, qty=0.3)).status_code == 409
    after = scrape(client)
    assert after[created] - before.get(created, 0) == 2
    assert after[conflicts] - before.get(conflicts, 0) == 1
    assert after[("order_requests_total", (("status", "409"),))] >= 1
    assert after[pending] == 2  # this app's database, read at scrape time

    run_table_relay(db_url, paper_settings(), "outbox_orders", once=True)
    assert scrape(client)[pending] == 0


def test_each_app_reports_the_gauges_of_its_own_database(api, client, pg_server):
    name, other_url = pg_server.create_database()
    other = ApiServers(other_url)
    try:
        with other.start().client() as other_client:
            assert post_order(client, order(KEY)).status_code == 201
            pending = ("outbox_pending_count", (("table", "outbox_orders"),))
            assert scrape(client)[pending] == 1
            assert scrape(other_client)[pending] == 0
    finally:
        other.stop_all()
        pg_server.drop_database(name)


# -- routing errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/nowhere", "/do/order/a%2Fb", "/do/order/a/b", "/do/orders"])
def test_unknown_paths_are_404_in_the_json_error_shape(client, path):
    assert_error(client.get(path), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("PUT", "/do/order", "POST"), ("DELETE", f"/do/order/{KEY}", "GET"), ("POST", "/healthz", "GET")],
)
def test_a_wrong_method_is_405_with_allow(client, conn, method, path, allow):
    response = client.request(
        method,
        path,
        content=json.dumps(order(KEY)).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": KEY},
    )
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert allow in response.headers["allow"]
    assert_nothing_stored(conn)


def test_without_its_database_the_api_answers_503_and_the_client_may_retry(pg_server):
    servers = ApiServers(pg_server.url_for("outbox_no_such_database"))
    try:
        with servers.start().client() as client:
            assert_error(client.get("/healthz"), 503, "DATABASE_UNAVAILABLE")
            error = assert_error(post_order(client, order(KEY)), 503, "DATABASE_UNAVAILABLE")
            assert "retry with the same key" in error["message"]
            assert_error(client.get(f"/do/order/{KEY}"), 503, "DATABASE_UNAVAILABLE")
            assert client.get("/metrics").status_code == 200  # a scrape does not fail with the database
    finally:
        servers.stop_all()
