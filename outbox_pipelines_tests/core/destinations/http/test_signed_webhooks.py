"""Signed webhooks: an HTTP table naming ``signing_secret_env`` sends Standard Webhooks headers, verified
here as a receiver would, with the spec's own library (``standardwebhooks``), over real sockets."""

import base64
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.orders.broker_sim import BackgroundServer
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import rows

TABLE = "billing_outbox"


def new_secret() -> str:
    """A secret as Standard Webhooks libraries generate it: whsec_ and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


@dataclass
class VerifyingReceiver:
    """A webhook endpoint that verifies every delivery with ``standardwebhooks`` and answers 400 to a
    signature it cannot verify (what a receiver written from the spec does)."""

    secret: str
    verified: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    ids_seen: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> "VerifyingReceiver":
        async def handle(request: web.Request) -> web.Response:
            raw = await request.read()
            headers = dict(request.headers)
            with self._lock:
                self.ids_seen.append(headers.get("webhook-id", ""))
            try:
                payload = Webhook(self.secret).verify(raw, headers)
            except WebhookVerificationError as exc:
                with self._lock:
                    self.refused.append(str(exc))
                return web.json_response({"error": f"signature: {exc}"}, status=400)
            with self._lock:
                self.verified.append(payload["invoice"])
            return web.json_response({"status": "accepted"})

        app = web.Application()
        app.router.add_post("/hooks", handle)
        self._server = BackgroundServer(app)
        self.url = self._server.start() + "hooks"
        return self

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def receiver() -> Iterator[VerifyingReceiver]:
    server = VerifyingReceiver(new_secret()).start()
    yield server
    server.stop()


def project(tmp_path: Path, url: str) -> Path:
    """An adopter's project: its outbox.toml names the variable holding the secret, never the secret."""
    (tmp_path / "outbox.toml").write_text(
        f'[tables.{TABLE}]\ndestination = "http"\nurl = "{url}"\nsigning_secret_env = "BILLING_HOOK_SECRET"\n'
        "max_attempts = 3\n"
    )
    return tmp_path


def enqueue_invoices(db_url: str, count: int) -> None:
    outbox = Outbox(TABLE)
    with psycopg.connect(db_url) as conn:  # one business transaction for the lot
        for i in range(count):
            outbox.enqueue(
                conn,
                Message(topic="invoice.issued", payload={"invoice": f"inv-{i}", "amount": i}),
                outside_transaction=True,
            )


def relay_once(cli_env: dict[str, str], cwd: Path) -> str:
    result = run_cli(cli_env, "relay", "--table", TABLE, "--once", "--quiet", cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_a_receiver_verifies_every_delivery_with_the_standard_library(db_url, cli_env, tmp_path, receiver):
    root = project(tmp_path, receiver.url)
    env = {**cli_env, "BILLING_HOOK_SECRET": receiver.secret}
    assert run_cli(env, "db", "create-table", TABLE, cwd=root).returncode == 0
    enqueue_invoices(db_url, 5)

    output = relay_once(env, root)

    assert sorted(receiver.verified) == [f"inv-{i}" for i in range(5)]
    assert receiver.refused == []
    # webhook-id is the message's event_id: what the receiver deduplicates on.
    with psycopg.connect(db_url) as conn:
        event_ids = {r[0] for r in conn.execute(f"select event_id from {TABLE}")}
        assert set(receiver.ids_seen) == event_ids
        assert {r[0] for r in conn.execute(f"select status from {TABLE}")} == {"sent"}
    assert receiver.secret not in output
    assert receiver.secret.removeprefix("whsec_") not in output


def test_a_receiver_with_another_secret_refuses_and_the_message_dies_as_bad_request(
    db_url, cli_env, tmp_path, receiver
):
    """The signature is real: signed with another secret, the receiver refuses it (400: dead BAD_REQUEST)."""
    root = project(tmp_path, receiver.url)
    env = {**cli_env, "BILLING_HOOK_SECRET": new_secret()}
    assert run_cli(env, "db", "create-table", TABLE, cwd=root).returncode == 0
    enqueue_invoices(db_url, 2)

    relay_once(env, root)

    assert receiver.verified == [] and len(receiver.refused) == 2
    with psycopg.connect(db_url) as conn:
        codes = {(r[0], r[1]) for r in conn.execute(f"select status, last_error_code from {TABLE}")}
    assert codes == {("dead", "BAD_REQUEST")}


def test_a_rotation_signs_with_both_secrets_so_either_receiver_verifies(db_url, cli_env, tmp_path, receiver):
    """During a rotation the variable holds the old and the new secret, separated by a space."""
    root = project(tmp_path, receiver.url)
    env = {**cli_env, "BILLING_HOOK_SECRET": f"{new_secret()} {receiver.secret}"}
    assert run_cli(env, "db", "create-table", TABLE, cwd=root).returncode == 0
    enqueue_invoices(db_url, 3)

    relay_once(env, root)

    assert sorted(receiver.verified) == ["inv-0", "inv-1", "inv-2"]


def test_a_retry_keeps_its_webhook_id_and_signs_afresh(db_url, conn, cli_env, tmp_path):
    """A redelivery carries the same webhook-id (the receiver drops it) with a new timestamp and signature."""
    secret = new_secret()
    seen: list[dict[str, str]] = []

    async def flaky(request: web.Request) -> web.Response:
        raw = await request.read()
        Webhook(secret).verify(raw, dict(request.headers))  # raises (500) if not verifiable
        seen.append(dict(request.headers))
        return web.json_response({"error": "busy"}, status=503) if len(seen) == 1 else web.json_response({})

    app = web.Application()
    app.router.add_post("/hooks", flaky)
    server = BackgroundServer(app)
    url = server.start() + "hooks"
    try:
        root = project(tmp_path, url)
        (root / "outbox.toml").write_text((root / "outbox.toml").read_text() + 'base = "10ms"\nmax_backoff = "10ms"\n')
        env = {**cli_env, "BILLING_HOOK_SECRET": secret}
        assert run_cli(env, "db", "create-table", TABLE, cwd=root).returncode == 0
        enqueue_invoices(db_url, 1)
        relay_once(env, root)
        if len(seen) < 2:  # the retry waited out its backoff past the first --once pass
            relay_once(env, root)
    finally:
        server.stop()
    assert len(seen) == 2
    assert seen[0]["webhook-id"] == seen[1]["webhook-id"]
    assert [r["status"] for r in rows(conn, TABLE)] == ["sent"]


def test_the_body_signed_is_the_body_sent(receiver):
    """What the receiver verifies is the exact JSON on the wire (non-ASCII text included)."""
    from outbox_pipelines_tests.core.destinations.http.test_http import claimed, http_destination

    with http_destination(receiver.url, "aiohttp-native", signing_secret=receiver.secret) as destination:
        [outcome] = destination.deliver([claimed(payload={"invoice": "inv-ü", "note": "naïve € 1/2"})])
    assert outcome.kind == "sent", outcome
    assert receiver.verified == ["inv-ü"]


def settings_of(section: str, environ: dict[str, str]):
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"signed-{os.getpid()}-{threading.get_ident()}.toml"
    path.write_text(f"shipped_tables = false\n[tables.{TABLE}]\n{section}\n")
    try:
        return load_settings(env=environ, path=path)
    finally:
        path.unlink()


@pytest.mark.parametrize(
    ("section", "environ", "says"),
    [
        ('destination = "http"\nurl = "http://127.0.0.1:9/"\nsigning_secret_env = "HOOK"', {}, "HOOK is not set"),
        (
            'destination = "http"\nurl = "http://127.0.0.1:9/"\nsigning_secret_env = "HOOK"',
            {"HOOK": "whsec_%%%"},
            "not base64",
        ),
        (
            'destination = "http"\nurl = "http://127.0.0.1:9/"\nsigning_secret_env = "HOOK"',
            {"HOOK": "whsec_c2hvcnQ="},
            "at least 16 bytes",
        ),
        (
            'destination = "handlers"\nhandlers = "outbox_pipelines.examples.handlers:registry"\n'
            'signing_secret_env = "HOOK"',
            {"HOOK": new_secret()},
            'applies to destination = "http"',
        ),
    ],
)
def test_a_signing_mistake_fails_the_table_at_load_saying_what_to_do(section, environ, says):
    settings = settings_of(section, environ)
    assert TABLE in settings.broken
    assert says in settings.broken[TABLE]
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace('"', '"')):
        settings.table(TABLE)


def test_the_secret_is_in_no_repr_and_no_status(db_url, cli_env, tmp_path, receiver):
    root = project(tmp_path, receiver.url)
    env = {**cli_env, "BILLING_HOOK_SECRET": receiver.secret}
    settings = settings_of(
        f'destination = "http"\nurl = "{receiver.url}"\nsigning_secret_env = "BILLING_HOOK_SECRET"',
        {"BILLING_HOOK_SECRET": receiver.secret},
    )
    assert receiver.secret not in repr(settings.table(TABLE))
    assert run_cli(env, "db", "create-table", TABLE, cwd=root).returncode == 0
    status = run_cli(env, "status", "--table", TABLE, "--json", cwd=root)
    assert status.returncode == 0, status.stderr
    assert receiver.secret not in status.stdout + status.stderr
    json.loads(status.stdout)


def _echoes_the_secret(secret: str) -> Iterator[str]:
    """Receivers that send the table's signing secret back: in a 400's body, and in an answer that is not HTTP."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=400, text=f"bad signature; expected with {secret} (key {secret[6:]})")

    app = web.Application()
    app.router.add_post("/hooks", handle)
    server = BackgroundServer(app)
    yield server.start() + "hooks"
    server.stop()

    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with client:
                client.recv(65536)
                client.sendall(f"NOT-HTTP {secret}\r\n\r\n".encode())

    threading.Thread(target=answer_garbage, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}/hooks"
    finally:
        listener.close()


def test_a_receiver_echoing_the_signing_secret_plants_it_nowhere(db_url, cli_env, tmp_path):
    """What a destination answers is stored and shown (last_error, the audit, replay, status): the table's signing
    secret, echoed back whole or as its base64 key, is taken out first, like its token and password."""
    secret = new_secret()
    env = {**cli_env, "BILLING_HOOK_SECRET": secret}
    said: list[str] = []
    receivers = _echoes_the_secret(secret)
    for url in receivers:
        root = project(tmp_path, url)  # the same project, its table now sent to this receiver
        if not said:
            assert run_cli(env, "db", "create-table", TABLE, cwd=root).returncode == 0
        enqueue_invoices(db_url, 1)
        said.append(relay_once(env, root))
        for command in (("replay", "--table", TABLE, "--all", "--dry-run", "--json", "--force"), ("status",)):
            shown = run_cli(env, *command, cwd=root)
            said.append(shown.stdout + shown.stderr)
    with psycopg.connect(db_url) as conn:
        stored = conn.execute(f"SELECT last_error_code, last_error FROM {TABLE} ORDER BY id").fetchall()
        audit = [r[0] for r in conn.execute("SELECT coalesce(detail::text, '') FROM outbox_audit")]
    assert [code for code, _ in stored] == ["BAD_REQUEST", "UNKNOWN"], stored
    assert "bad signature" in stored[0][1], stored  # the answer is kept, less the secret
    for text in [*said, *(error for _, error in stored), *audit]:
        assert secret not in text and secret[6:] not in text, text
