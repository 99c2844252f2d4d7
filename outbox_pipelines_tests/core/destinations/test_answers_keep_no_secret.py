"""Issue 22: what a destination answers never carries its credential on, and never costs unbounded memory.

Real sockets on 127.0.0.1, every transport: a broker that echoes the request's headers (and its own URL)
in a 4xx / 5xx / 409 body; a webhook whose URL path and query are its secret; an answer that never ends;
a redirect to another origin.
"""

import asyncio
import base64
import json
import logging
from collections.abc import Iterator

import pytest
from aiohttp import web

from outbox_pipelines.core.destinations.http.destination import MAX_BODY_BYTES, TRANSPORTS
from outbox_pipelines.core.redaction import Scrubber, mask_credentials, url_origin
from outbox_pipelines.orders.broker_sim import BackgroundServer
from outbox_pipelines_tests.core.destinations.http.test_http import claimed, deliver_one

TOKEN = "tok-3f9a1c77e2b4d0aa"
USER, PASSWORD = "svc-outbox", "pw-9d8c7b6a5f"
SECRET_PATH = "/services/T0001/B0002/XyZsecretPathPart42"
SECRET_QUERY = "apikey=k3y-0f-the-hook-771"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def _secrets() -> tuple[str, ...]:
    return (TOKEN, PASSWORD, BASIC, "XyZsecretPathPart42", "k3y-0f-the-hook-771")


def assert_clean(text: str | None, what: str) -> None:
    for secret in _secrets():
        assert secret not in (text or ""), f"{what}: {secret} in {text!r}"


class Echo:
    """A broker that answers ``status`` with a body repeating every request header and the URL it was asked."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        headers = dict(request.headers)
        self.requests.append(headers)
        # What a misconfigured gateway does: the credential it refused first, then every header and the URL.
        body = {
            "error": f"rejected Authorization: {headers.get('Authorization')}",
            "url": str(request.url),
            "your_headers": headers,
            "raw": "\n".join(f"{k}: {v}" for k, v in headers.items()),
        }
        return web.Response(status=self.status, text=json.dumps(body), content_type="application/json")


@pytest.fixture
def serve() -> Iterator:
    servers: list[BackgroundServer] = []

    def start(handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        server = BackgroundServer(app)
        servers.append(server)
        return server.start().rstrip("/")

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("status", [400, 409, 422, 500, 503, 418])
@pytest.mark.parametrize("credential", ["bearer", "basic"])
def test_an_echoed_credential_never_reaches_the_outcome(serve, transport, status, credential):
    """Before: last_error held 'Bearer <token>' (or the Basic base64), and from there the audit, the
    ledger, destination health, alerts, asset-check metadata, status --json and the Order API."""
    echo = Echo(status)
    base = serve(echo.handle)
    if credential == "bearer":
        url, token = f"{base}{SECRET_PATH}?{SECRET_QUERY}", TOKEN
    else:
        url, token = f"{base.replace('http://', f'http://{USER}:{PASSWORD}@')}{SECRET_PATH}?{SECRET_QUERY}", None
    outcome = deliver_one(url, transport, token=token)
    assert echo.requests, "the request was not sent"
    sent = echo.requests[0].get("Authorization")
    assert sent == (f"Bearer {TOKEN}" if token else f"Basic {BASIC}")  # the credential did travel
    assert outcome.kind in ("dead", "retry") and outcome.error, outcome
    assert "your_headers" in outcome.error or "rejected" in outcome.error  # the answer is still told
    assert_clean(outcome.error, f"{transport} {status} {credential}")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_connection_names_the_origin_only(transport):
    outcome = deliver_one(f"http://127.0.0.1:9{SECRET_PATH}?{SECRET_QUERY}", transport, token=TOKEN)
    assert outcome.kind == "retry" and outcome.code == "CONNECTION_REFUSED", outcome
    assert_clean(outcome.error, transport)


def test_a_destination_is_named_by_its_origin():
    assert (
        url_origin(f"https://u:p@hooks.example.com:8443{SECRET_PATH}?{SECRET_QUERY}")
        == "https://hooks.example.com:8443"
    )
    assert url_origin("http://[::1]:99/x") == "http://[::1]:99"
    assert url_origin("not a url") == "<unparsable URL>"


def test_the_scrubber_and_the_mask_leave_plain_words_alone():
    scrub = Scrubber("http://127.0.0.1:1/orders", token=TOKEN)
    assert scrub("basic validation failed for /orders") == "basic validation failed for /orders"
    assert scrub(f"got Bearer {TOKEN}") == "got Bearer ***"
    assert mask_credentials('{"Authorization": "Bearer abcdefgh12"}') == '{"Authorization": "***"}'
    assert mask_credentials("x-api-key: 123456789") == "x-api-key: ***"
    assert mask_credentials("see https://a:b@host/x") == "see https://***@host/x"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("status", [200, 503])
def test_an_answer_that_never_ends_is_read_up_to_the_cap(serve, transport, status):
    """Before: the whole body was read, so an endless answer ran into the timeout (and could fill memory)."""
    chunk = b"x" * 65536

    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=status, headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        try:
            while True:
                await response.write(chunk)
                await asyncio.sleep(0)
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    base = serve(endless)
    outcome = deliver_one(f"{base}/hook", transport, timeout_s=20.0)
    expected = ("sent", None) if status == 200 else ("retry", "BROKER_5XX")
    assert (outcome.kind, outcome.code) == expected, outcome
    assert MAX_BODY_BYTES <= 4 * 1024 * 1024


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_redirect_is_not_followed_so_the_credential_stays_with_its_origin(serve, transport):
    elsewhere: list[dict[str, str]] = []

    async def collector(request: web.Request) -> web.Response:
        elsewhere.append(dict(request.headers))
        return web.json_response({"status": "accepted"})

    other = serve(collector)

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=307, headers={"Location": f"{other}/steal"})

    outcome = deliver_one(f"{serve(redirect)}/orders", transport, token=TOKEN, message=claimed("ev-redirect"))
    assert elsewhere == [], "the request followed the redirect to another origin"
    assert (outcome.kind, outcome.code) == ("retry", "UNKNOWN"), outcome


@pytest.mark.parametrize("transport", ["httpx-sync", "httpx-async", "aiohttp"])
def test_the_http_clients_request_log_names_the_origin_only(serve, transport, caplog):
    """httpx logs every request's full URL at INFO: a webhook's secret path and ?apikey= with it."""
    echo = Echo(200)
    base = serve(echo.handle)
    caplog.set_level(logging.DEBUG)
    outcome = deliver_one(f"{base}{SECRET_PATH}?{SECRET_QUERY}", transport, token=TOKEN)
    assert outcome.kind == "sent", outcome
    assert "HTTP Request: POST" in caplog.text  # the client did log the request...
    assert_clean(caplog.text, f"{transport} log")  # ...without the secret parts of its URL


def test_an_alert_webhook_is_named_by_its_origin(caplog, serve):
    from outbox_pipelines.core.oncall.alerts import post_alert

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=500, text=f"bad hook {request.url}")

    base = serve(refuse)
    caplog.set_level(logging.DEBUG)
    assert post_alert({"text": "x"}, f"{base}{SECRET_PATH}?{SECRET_QUERY}") is False
    assert post_alert({"text": "x"}, f"http://127.0.0.1:9{SECRET_PATH}?{SECRET_QUERY}") is False
    assert f"alert webhook {base} answered HTTP 500" in caplog.text
    assert "alert webhook http://127.0.0.1:9 unreachable" in caplog.text
    assert_clean(caplog.text, "alert logs")
