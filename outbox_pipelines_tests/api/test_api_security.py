"""Issue 9, the Order API's security: scopes by HMAC, throttled guessing, no open API by accident.

- A caller's ledger scope (and the key the broker sees) is an HMAC of its token with
  a server secret (OUTBOX_API_SCOPE_SECRET, else one per database), never a bare hash;
  two API instances on one database agree; keys accepted the old way still replay.
- Failed authentications are limited per client address before the token is looked at.
- Without tokens the API refuses a non-loopback address unless allowed; /metrics can
  require the token.
- A client that disconnects mid-body is INFO and status 499, never an ERROR or a 500.
"""

import hashlib
import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.orders.api import server
from outbox_pipelines.orders.api.app import ApiSettings
from outbox_pipelines.orders.api.auth import (
    check_exposure,
    hmac_scope,
    is_loopback,
    legacy_scope,
)
from outbox_pipelines.orders.api.ratelimit import FailureLimiter
from outbox_pipelines_tests.api.conftest import (
    LiveApi,
    assert_error,
    assert_nothing_stored,
    ledger,
    order,
    post_order,
    sample,
)
from outbox_pipelines_tests.helpers import accept_order, rows

KEY = "01JABCXYZ-ULID-5678"
TOKEN = "token-alpha-1f3e"
OTHER = "token-bravo-9c2d"
REPO = Path(__file__).resolve().parents[2]


def database_secret(conn: psycopg.Connection) -> str | None:
    row = conn.execute("SELECT secret FROM outbox_api_secret").fetchone()
    return row["secret"] if row else None


# -- the per-caller scope --------------------------------------------------------------------------
def test_the_scope_is_an_hmac_with_one_secret_per_database_that_every_instance_shares(start_api, conn):
    conn.execute("TRUNCATE outbox_api_secret")
    first = start_api(tokens=(TOKEN, OTHER))
    second = start_api(tokens=(TOKEN, OTHER))
    with first.client(TOKEN) as one, second.client(TOKEN) as two:
        assert post_order(one, order(KEY)).status_code == 201
        # The other instance finds the same order: same secret, same scope.
        assert post_order(two, order(KEY)).status_code == 200
        assert post_order(two, order(KEY, qty=0.5)).status_code == 409
        assert two.get(f"/do/order/{KEY}").status_code == 200

    secret = database_secret(conn)
    assert secret is not None and len(secret) == 64  # 256 random bits, created on first use
    [entry] = ledger(conn)
    assert entry["scope"] == hmac_scope(secret, TOKEN)
    assert entry["scope"].startswith("h:") and len(entry["scope"]) == 2 + 32
    unsalted = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert unsalted[:16] not in entry["scope"] and entry["scope"] != legacy_scope(TOKEN)
    [row] = rows(conn, "outbox_orders")
    assert row["event_id"] == f"{entry['scope']}:{KEY}"  # what the broker sees: no token, no bare hash
    assert TOKEN not in json.dumps(row["headers"]) + row["event_id"] + json.dumps(row["payload"])


def test_a_scope_secret_from_the_environment_wins_and_nothing_is_stored_for_it(start_api, conn, monkeypatch):
    conn.execute("TRUNCATE outbox_api_secret")
    monkeypatch.setenv("OUTBOX_API_SCOPE_SECRET", "s3cret-from-the-kms-0123456789abcdef")
    monkeypatch.setenv("OUTBOX_API_TOKEN", f"{TOKEN}, {OTHER}")
    settings = ApiSettings.from_env("postgresql:///x")
    assert settings.tokens == (TOKEN, OTHER)
    assert settings.scope_secret == "s3cret-from-the-kms-0123456789abcdef"
    assert TOKEN not in repr(settings) and "s3cret" not in repr(settings)
    api = start_api(tokens=(TOKEN,), scope_secret="s3cret-from-the-kms-0123456789abcdef")
    with api.client(TOKEN) as client:
        assert post_order(client, order(KEY)).status_code == 201
    assert ledger(conn)[0]["scope"] == hmac_scope("s3cret-from-the-kms-0123456789abcdef", TOKEN)
    assert database_secret(conn) is None


def test_a_short_scope_secret_is_refused():
    with pytest.raises(ConfigError, match="OUTBOX_API_SCOPE_SECRET must be at least 16"):
        ApiSettings(database_url="postgresql:///x", tokens=(TOKEN,), scope_secret="short")


def test_keys_accepted_before_the_upgrade_still_replay_under_their_legacy_scope(start_api, conn, db_url):
    """The old API scoped keys t:+sha256(token)[:16]: such a key replayed after the upgrade is a replay
    (200 / 409 / GET), not a second order, and the broker keeps seeing the key it already has."""
    with psycopg.connect(db_url) as old:  # what the previous version stored, with the same core function
        accept_order(old, legacy_scope(TOKEN), order(KEY), trace_id="before-upgrade")
    api = start_api(tokens=(TOKEN, OTHER))
    with api.client(TOKEN) as client, api.client(OTHER) as other:
        replay = post_order(client, order(KEY))
        assert replay.status_code == 200, replay.text
        assert_error(post_order(client, order(KEY, qty=0.5)), 409, "IDEMPOTENCY_CONFLICT")
        assert client.get(f"/do/order/{KEY}").json()["status"] == "accepted"
        # Another token never reaches that row; new keys get the new scope.
        assert post_order(other, order(KEY)).status_code == 201
        assert post_order(client, order("k-after-upgrade")).status_code == 201
    scopes = {(e["idempotency_key"], e["scope"]) for e in ledger(conn)}
    secret = database_secret(conn)
    assert scopes == {
        (KEY, legacy_scope(TOKEN)),
        (KEY, hmac_scope(secret, OTHER)),
        ("k-after-upgrade", hmac_scope(secret, TOKEN)),
    }
    assert [r["event_id"] for r in rows(conn, "outbox_orders")] == [
        f"{legacy_scope(TOKEN)}:{KEY}",
        f"{hmac_scope(secret, OTHER)}:{KEY}",
        f"{hmac_scope(secret, TOKEN)}:k-after-upgrade",
    ]


# -- failed authentications ------------------------------------------------------------------------
def test_failure_limiter_blocks_after_the_limit_and_lets_go_as_failures_leak_away():
    now = [0.0]
    limiter = FailureLimiter(10, clock=lambda: now[0])
    for _ in range(10):
        assert limiter.blocked("a") == 0
        limiter.failed("a")
    assert limiter.blocked("a") == 6  # one failure leaks away every 6 s
    assert limiter.blocked("b") == 0
    now[0] = 6.0
    assert limiter.blocked("a") == 0


def test_300_wrong_tokens_get_429_after_the_first_ten_and_another_address_is_unaffected(start_api, conn):
    api = start_api(tokens=(TOKEN,))
    statuses = []
    started = time.monotonic()
    with api.client("wrong-token") as guesser:
        for i in range(300):
            response = post_order(guesser, order(f"k-guess-{i}"))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert_error(response, 429, "RATE_LIMITED")
                assert int(response.headers["retry-after"]) >= 1
        # The limit is per address, before the token is looked at: the right token waits too, and /metrics
        # (which needs the token) is no way around it.
        assert_error(post_order(guesser, order(KEY), Authorization=f"Bearer {TOKEN}"), 429, "RATE_LIMITED")
        assert guesser.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
        assert guesser.get("/healthz").status_code == 200
    assert statuses[:10] == [401] * 10 and statuses[10:] == [429] * 290, statuses
    print(f"\n300 wrong tokens in {time.monotonic() - started:.2f} s: 10 x 401, 290 x 429")

    # Another address (127.0.0.2, also loopback) with the right token is served as usual.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(
        base_url=api.url, transport=transport, trust_env=False, timeout=15, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as elsewhere:
        assert post_order(elsewhere, order(KEY)).status_code == 201
        assert elsewhere.get(f"/do/order/{KEY}").status_code == 200
    assert [e["idempotency_key"] for e in ledger(conn)] == [KEY]


def test_failed_authentications_behind_a_trusted_proxy_count_per_forwarded_client(start_api, conn):
    api = start_api(tokens=(TOKEN,), trusted_proxies=("127.0.0.0/8",), auth_failures_per_minute=3)
    with api.client("wrong") as client:
        for _ in range(3):
            assert_error(post_order(client, order(KEY), X_Forwarded_For="203.0.113.7"), 401, "UNAUTHORIZED")
        assert_error(post_order(client, order(KEY), X_Forwarded_For="203.0.113.7"), 429, "RATE_LIMITED")
        ok = post_order(client, order(KEY), X_Forwarded_For="203.0.113.8", Authorization=f"Bearer {TOKEN}")
        assert ok.status_code == 201


# -- open or not -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.10", False),
        ("api.example.com", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_without_tokens_a_non_loopback_address_is_refused_unless_anonymous_is_allowed():
    with pytest.raises(
        ConfigError, match="refusing to serve the Order API on 0.0.0.0 without a token.*--allow-anonymous"
    ):
        check_exposure("0.0.0.0", has_tokens=False, allow_anonymous=False)
    assert "--allow-anonymous" in check_exposure("0.0.0.0", has_tokens=False, allow_anonymous=True)
    assert "open on loopback only" in check_exposure("127.0.0.1", has_tokens=False, allow_anonymous=False)
    assert check_exposure("0.0.0.0", has_tokens=True, allow_anonymous=False) is None


def test_serve_refuses_before_listening_and_warns_once_on_loopback(monkeypatch, caplog):
    monkeypatch.delenv("OUTBOX_API_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="without a token"):
        server.serve("postgresql:///unused", "0.0.0.0", 1, say=lambda _: None)
    caplog.set_level(logging.WARNING, logger="outbox_pipelines.orders.api")
    server.prepare("postgresql:///unused", "127.0.0.1")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "open on loopback only" in warnings[0].getMessage()
    caplog.clear()
    monkeypatch.setenv("OUTBOX_API_TOKEN", TOKEN)
    assert server.prepare("postgresql:///unused", "0.0.0.0").tokens == (TOKEN,)
    assert not caplog.records


def test_the_cli_refuses_a_public_address_without_a_token_exit_2(cli_env):
    env = {k: v for k, v in cli_env.items() if k != "OUTBOX_API_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "outbox_pipelines.cli", "order-api", "--host", "0.0.0.0", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "without a token" in out and "--allow-anonymous" in out and "Traceback" not in out


def test_metrics_need_the_token_when_tokens_are_set(start_api, db_url):
    protected = start_api(tokens=(TOKEN,))
    with protected.client() as anonymous, protected.client(TOKEN) as caller:
        response = anonymous.get("/metrics")
        assert_error(response, 401, "UNAUTHORIZED")
        assert response.headers["www-authenticate"] == "Bearer"
        assert b"order_requests_total" in caller.get("/metrics").content
        assert anonymous.get("/healthz").status_code == 200  # health stays open for probes
    opened = start_api(tokens=(TOKEN,), metrics_require_token=False)
    with opened.client() as anonymous:
        assert anonymous.get("/metrics").status_code == 200
    with pytest.raises(ConfigError, match="OUTBOX_API_METRICS_REQUIRE_TOKEN=true needs OUTBOX_API_TOKEN"):
        ApiSettings(database_url=db_url, metrics_require_token=True)


def test_metrics_require_token_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("OUTBOX_API_TOKEN", TOKEN)
    for raw, protected in (("", True), ("true", True), ("false", False), ("0", False)):
        monkeypatch.setenv("OUTBOX_API_METRICS_REQUIRE_TOKEN", raw)
        assert ApiSettings.from_env("postgresql:///x").metrics_protected is protected
    monkeypatch.setenv("OUTBOX_API_METRICS_REQUIRE_TOKEN", "maybe")
    with pytest.raises(ConfigError, match="true or false"):
        ApiSettings.from_env("postgresql:///x")


# -- a client that goes away -----------------------------------------------------------------------
def test_a_client_that_disconnects_mid_body_is_info_and_499_not_an_error(start_api, conn, caplog):
    api: LiveApi = start_api()
    caplog.set_level(logging.DEBUG)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addHandler(caplog.handler)
    errors_before = sample("order_requests_total", status="500")
    closed_before = sample("order_requests_total", status="499")
    try:
        host, port = api.url.removeprefix("http://").split(":")
        body = json.dumps(order(KEY)).encode()
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                b"POST /do/order HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Idempotency-Key: {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
            time.sleep(0.2)
        deadline = time.monotonic() + 5
        while sample("order_requests_total", status="499") == closed_before and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).removeHandler(caplog.handler)
    assert sample("order_requests_total", status="499") == closed_before + 1
    assert sample("order_requests_total", status="500") == errors_before
    lines = [r for r in caplog.records if r.name == "outbox_pipelines.orders.api"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert (lines[0].levelno, lines[0].status, lines[0].reason_code) == (logging.INFO, 499, "CLIENT_DISCONNECTED")
    assert lines[0].idempotency_key == KEY
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert not any(r.exc_info for r in caplog.records)
    assert_nothing_stored(conn)


def test_the_default_api_settings_hide_tokens_and_urls_from_repr():
    settings = ApiSettings(database_url="postgresql://u:pw@db/x", tokens=(TOKEN,), scope_secret="x" * 32)
    assert TOKEN not in repr(settings) and "pw" not in repr(settings) and "x" * 32 not in repr(settings)


def test_rate_and_body_limits_from_the_environment_must_be_whole_positive_numbers(monkeypatch):
    for name, value in (
        ("OUTBOX_API_RATE_PER_MINUTE", "-5"),
        ("OUTBOX_API_RATE_PER_MINUTE", "lots"),
        ("OUTBOX_API_MAX_BODY_BYTES", "0"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError, match=name):
            ApiSettings.from_env("postgresql:///x")
        monkeypatch.delenv(name)
    monkeypatch.setenv("OUTBOX_API_RATE_PER_MINUTE", "")
    assert ApiSettings.from_env("postgresql:///x").rate_per_minute == 60
