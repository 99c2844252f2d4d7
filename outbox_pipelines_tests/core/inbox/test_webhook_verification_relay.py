"""A receiver on a real socket (http.server on 127.0.0.1, headers read as Latin-1 as WSGI and ASGI servers read
them) verifies with ``WebhookVerifier`` what a relay of a table naming ``signing_secret_env`` sends: every
delivery verifies, during a rotation a receiver knowing either secret verifies, and a tampered body, a replay
past the tolerance and another secret are each refused (400) with their own error."""

import base64
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines import (
    Message,
    Outbox,
    WebhookSignatureMismatch,
    WebhookTimestampTooNew,
    WebhookTimestampTooOld,
    WebhookVerificationError,
    WebhookVerifier,
)
from outbox_pipelines_tests.conftest import REPO, run_cli
from outbox_pipelines_tests.processes import free_port, port_open, wait_until

TABLE = "billing_outbox"
SECRET_ENV = "BILLING_HOOK_SECRET"


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    verdicts: dict[str, str]  # receiver's name -> "verified" or the error's class name


class Receiver:
    """Each request is verified by every named verifier; 200 when the first verifies, else 400 with the error.
    ``clock_ahead`` moves the receiver's clock, to replay a delivery later without waiting."""

    def __init__(self, verifiers: dict[str, WebhookVerifier]) -> None:
        self.verifiers = verifiers
        self.deliveries: list[Delivery] = []
        self.clock_ahead = timedelta(0)
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                now = datetime.now(UTC) + receiver.clock_ahead
                verdicts = {}
                for name, verifier in receiver.verifiers.items():
                    try:
                        verifier.verify(self.headers, body, now=now)  # http.server's headers, as they are
                        verdicts[name] = "verified"
                    except WebhookVerificationError as exc:
                        verdicts[name] = type(exc).__name__
                        error = str(exc)
                with receiver._lock:
                    receiver.deliveries.append(Delivery(dict(self.headers.items()), body, verdicts))
                first = verdicts[next(iter(verdicts))]
                answer = b'{"status": "accepted"}' if first == "verified" else json.dumps({"error": error}).encode()
                self.send_response(200 if first == "verified" else 400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def post(self, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        """Send a request as an attacker would: a captured delivery, changed or not."""
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()


def relay_to(receiver: Receiver, cli_env: dict[str, str], root: Path, db_url: str, secret: str, count: int) -> str:
    """``count`` invoices enqueued in a table signed with ``secret``, relayed once to ``receiver``."""
    (root / "outbox.toml").write_text(
        f'[tables.{TABLE}]\ndestination = "http"\nurl = "{receiver.url}"\nsigning_secret_env = "{SECRET_ENV}"\n'
        "max_attempts = 3\n"
    )
    env = {**cli_env, SECRET_ENV: secret}
    created = run_cli(env, "db", "create-table", TABLE, cwd=root)
    assert created.returncode == 0, created.stdout + created.stderr
    outbox = Outbox(TABLE)
    with psycopg.connect(db_url) as conn:
        for i in range(count):
            outbox.enqueue(conn, Message(topic="invoice.issued", payload={"invoice": f"inv-{i}", "amount": i}))
    done = run_cli(env, "relay", "--table", TABLE, "--once", "--quiet", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def statuses(db_url: str) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(f"SELECT event_id, status, last_error_code FROM {TABLE}").fetchall()
    return {event_id: (status, code) for event_id, status, code in rows}


@pytest.fixture
def secret() -> str:
    return new_secret()


@pytest.fixture
def receiver(secret: str) -> Iterator[Receiver]:
    with Receiver({"receiver": WebhookVerifier(secret)}) as server:
        yield server


def test_every_delivery_of_a_relay_verifies(db_url, cli_env, tmp_path, secret, receiver):
    output = relay_to(receiver, cli_env, tmp_path, db_url, secret, 5)

    assert [d.verdicts for d in receiver.deliveries] == [{"receiver": "verified"}] * 5
    assert sorted(json.loads(d.body)["invoice"] for d in receiver.deliveries) == [f"inv-{i}" for i in range(5)]
    rows = statuses(db_url)
    assert set(rows.values()) == {("sent", None)}
    assert {d.headers["webhook-id"] for d in receiver.deliveries} == set(rows)  # what a receiver deduplicates on
    assert secret.removeprefix("whsec_") not in output


def test_during_a_rotation_a_receiver_knowing_either_secret_verifies(db_url, cli_env, tmp_path):
    old, new = new_secret(), new_secret()
    verifiers = {"old": WebhookVerifier(old), "new": WebhookVerifier(new), "both": WebhookVerifier([old, new])}
    with Receiver(verifiers) as receiver:
        relay_to(receiver, cli_env, tmp_path, db_url, f"{old} {new}", 3)

    assert [d.verdicts for d in receiver.deliveries] == [{"old": "verified", "new": "verified", "both": "verified"}] * 3
    assert all(len(d.headers["webhook-signature"].split()) == 2 for d in receiver.deliveries)


def test_a_receiver_with_another_secret_refuses_every_delivery_and_they_die_as_bad_requests(
    db_url, cli_env, tmp_path, receiver
):
    relay_to(receiver, cli_env, tmp_path, db_url, new_secret(), 2)

    assert [d.verdicts for d in receiver.deliveries] == [{"receiver": WebhookSignatureMismatch.__name__}] * 2
    assert set(statuses(db_url).values()) == {("dead", "BAD_REQUEST")}


def test_a_tampered_body_and_a_late_replay_are_each_refused_with_their_own_error(
    db_url, cli_env, tmp_path, secret, receiver
):
    relay_to(receiver, cli_env, tmp_path, db_url, secret, 1)
    [genuine] = receiver.deliveries
    assert genuine.verdicts == {"receiver": "verified"}
    captured = {name: genuine.headers[name] for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    captured["Content-Type"] = "application/json"

    tampered = genuine.body.replace(b'"amount":0', b'"amount":1000')
    assert tampered != genuine.body
    assert receiver.post(captured, tampered)[0] == 400

    receiver.clock_ahead = timedelta(minutes=5, seconds=30)  # the same request, captured and sent again later
    status, answer = receiver.post(captured, genuine.body)
    assert status == 400 and "past the 300 s tolerance" in answer

    receiver.clock_ahead = -timedelta(minutes=5, seconds=30)  # or this receiver's clock runs behind
    assert receiver.post(captured, genuine.body)[0] == 400

    receiver.clock_ahead = timedelta(minutes=4)  # within the tolerance: a replay the inbox must catch
    assert receiver.post(captured, genuine.body)[0] == 200

    verdicts = [d.verdicts["receiver"] for d in receiver.deliveries]
    assert verdicts == [
        "verified",
        WebhookSignatureMismatch.__name__,
        WebhookTimestampTooOld.__name__,
        WebhookTimestampTooNew.__name__,
        "verified",
    ]
    assert statuses(db_url) == {captured["webhook-id"]: ("sent", None)}


def test_the_shipped_receiver_records_each_event_id_once_however_long_its_header_form(
    db_url, conn, cli_env, tmp_path, secret
):
    """examples/consumers/webhook_receiver.py, as a process, fed by the relay: event ids of 255 characters full of
    dots or of non-ASCII letters travel percent-encoded in webhook-id (over 255 characters there); ``verify``
    gives the event_id back, which the inbox records once, and every message is answered 200 and sent."""
    port = free_port()
    (tmp_path / "outbox.toml").write_text(
        f'[tables.{TABLE}]\ndestination = "http"\nurl = "http://127.0.0.1:{port}/hooks"\n'
        f'signing_secret_env = "{SECRET_ENV}"\nmax_attempts = 3\n\n[inboxes.shipping_inbox]\n'
    )
    env = {**cli_env, SECRET_ENV: secret}
    upgraded = run_cli(env, "db", "upgrade", cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    conn.execute("CREATE TABLE shipments (id bigserial PRIMARY KEY, event_id text NOT NULL, payload jsonb)")
    event_ids = ["order." * 40 + "x" * 15, "注文" * 127 + "x", "заказ.№" * 36 + "xxx", "plain-1"]
    assert [len(e) for e in event_ids] == [255, 255, 255, 7]
    outbox = Outbox(TABLE)
    with psycopg.connect(db_url) as writer:
        for event_id in event_ids:
            outbox.enqueue(writer, Message(topic="order.created", payload={"id": event_id}, event_id=event_id))
    receiver = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "consumers" / "webhook_receiver.py")],
        env={**os.environ, "DATABASE_URL": db_url, "WEBHOOK_SECRET": secret, "PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: port_open(port), 30, "the receiver listening")
        done = run_cli(env, "relay", "--table", TABLE, "--once", "--quiet", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert {e: s for e, (s, _) in statuses(db_url).items()} == dict.fromkeys(event_ids, "sent")
    finally:
        receiver.terminate()
        out, err = receiver.communicate(timeout=10)
    assert "Traceback" not in err, err
    recorded = [r["message_id"] for r in conn.execute("SELECT message_id FROM shipping_inbox ORDER BY message_id")]
    assert recorded == sorted(event_ids)
    assert sorted(r["event_id"] for r in conn.execute("SELECT event_id FROM shipments")) == sorted(event_ids)
