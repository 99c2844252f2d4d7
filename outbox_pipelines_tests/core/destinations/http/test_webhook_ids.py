"""Signed webhooks verify with the official ``standardwebhooks`` library whatever characters the event id holds
(issue 42, point 7): the webhook-id travels as ASCII (non-ASCII percent-encoded, no ``.``) and the signature is
over the id exactly as sent. Verified by receivers that read headers as WSGI/ASGI/http.server do (Latin-1) and
as aiohttp does (UTF-8), over every HTTP transport, over real sockets."""

import base64
import http.server
import json
import os
import threading
from collections.abc import Iterator
from urllib.parse import unquote

import pytest
from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations.http.destination import TRANSPORTS
from outbox_pipelines.core.destinations.signing import header_id
from outbox_pipelines.orders.broker_sim import BackgroundServer
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.core.destinations.http.test_http import claimed, http_destination
from outbox_pipelines_tests.helpers import rows

IDS = [
    "inv-0001",
    "3f2b9c1e-7a44-4d0e-9d8e-1c2b3a4d5e6f",
    "заказ-42",
    "注文-7",
    "party-🎉-emoji",
    "with inner space",
    " leading and trailing ",
    "order.42.created",
    "100%-done",
    "a%2Eb",
    "Zürich/ÄÖÜ",
]


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


class Latin1Receiver:
    """A webhook endpoint on http.server: headers decoded as Latin-1, as WSGI, ASGI and http.server all do.
    It verifies with ``standardwebhooks`` and answers 400 to what it cannot verify."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.verified: list[str] = []  # the webhook-id of each verified delivery
        self.refused: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {name: value for name, value in self.headers.items()}
                try:
                    Webhook(receiver.secret).verify(body, headers)
                    receiver.verified.append(headers["webhook-id"])
                    status = 200
                except WebhookVerificationError as exc:
                    receiver.refused.append(f"{headers.get('webhook-id')!r}: {exc}")
                    status = 400
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"

    def __enter__(self) -> "Latin1Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class Utf8Receiver:
    """The same endpoint on aiohttp, which decodes header bytes as UTF-8."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.verified: list[str] = []
        self.refused: list[str] = []

    def __enter__(self) -> "Utf8Receiver":
        async def handle(request: web.Request) -> web.Response:
            raw = await request.read()
            try:
                Webhook(self.secret).verify(raw, dict(request.headers))
            except WebhookVerificationError as exc:
                self.refused.append(f"{request.headers.get('webhook-id')!r}: {exc}")
                return web.json_response({}, status=400)
            self.verified.append(request.headers["webhook-id"])
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/hooks", handle)
        self._server = BackgroundServer(app)
        self.url = self._server.start() + "hooks"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


@pytest.fixture(params=["latin-1", "utf-8"])
def receiver(request) -> Iterator[Latin1Receiver | Utf8Receiver]:
    kind = Latin1Receiver if request.param == "latin-1" else Utf8Receiver
    with kind(new_secret()) as server:
        yield server


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_event_id_verifies_with_the_official_library_on_every_transport(receiver, transport):
    messages = [claimed(event_id=event_id, id=n, payload={"n": n}) for n, event_id in enumerate(IDS)]
    with http_destination(receiver.url, transport, signing_secret=receiver.secret) as destination:
        outcomes = destination.deliver(messages)

    assert receiver.refused == []
    assert [o.kind for o in outcomes] == ["sent"] * len(IDS), [o.error for o in outcomes]
    # Each id arrives as one distinct ASCII webhook-id without a ".", and decodes back to the event id.
    assert sorted(receiver.verified) == sorted(header_id(i, keep_dots=False) for i in IDS)
    assert len(set(receiver.verified)) == len(IDS)
    for sent in receiver.verified:
        assert sent.isascii() and "." not in sent and sent == sent.strip()
    assert sorted(unquote(sent) for sent in receiver.verified) == sorted(IDS)


def test_an_id_of_plain_ascii_is_sent_as_it_is():
    """Printable ASCII without "%" or "." goes out unchanged: what receivers already deduplicate on."""
    for event_id in ("inv-0001", "3f2b9c1e-7a44-4d0e-9d8e-1c2b3a4d5e6f", "with inner space", "A_b:c/d@e"):
        assert header_id(event_id, keep_dots=False) == event_id
    assert header_id("order.42") == "order.42"  # the Idempotency-Key keeps its dots


def test_a_relay_delivers_a_unicode_event_id_that_a_latin1_receiver_verifies(conn, cli_env, tmp_path):
    """End to end: enqueue with a non-ASCII event id, relay with the CLI, verify as a Starlette/Flask app would."""
    secret = new_secret()
    with Latin1Receiver(secret) as receiver:
        (tmp_path / "outbox.toml").write_text(
            f'[tables.billing_outbox]\ndestination = "http"\nurl = "{receiver.url}"\n'
            'signing_secret_env = "BILLING_HOOK_SECRET"\nmax_attempts = 1\n'
        )
        env = {**cli_env, "BILLING_HOOK_SECRET": secret}
        assert run_cli(env, "db", "create-table", "billing_outbox", cwd=tmp_path).returncode == 0
        Outbox("billing_outbox").enqueue(
            conn, Message(topic="invoice.issued", payload={"n": 1}, event_id="счёт-№7.😀"), outside_transaction=True
        )
        result = run_cli(env, "relay", "--table", "billing_outbox", "--once", "--quiet", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        [row] = rows(conn, "billing_outbox")
    assert receiver.refused == []
    assert receiver.verified == [header_id("счёт-№7.😀", keep_dots=False)]
    assert row["status"] == "sent", json.dumps(row, default=str)
