"""Issue 22: a broker that echoes request headers cannot carry the credential to anyone.

Before: an answer that repeated ``Authorization: Bearer <token>`` (or the Basic credential's base64)
was stored in ``last_error``, the audit, destination health and the ledger, and from there reached
Order API callers (``GET /do/order/{key}`` ``reason``), alert figures, asset-check metadata and
``status --json``. The whole path, as it runs: the Order API takes orders, a real CLI relay sends
them to a gateway that echoes the headers it got (400 for one order, 503 for the others), and every
place an operator or a caller reads is searched for the token.
"""

import json
from collections.abc import Iterator

import pytest
from aiohttp import web

from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
from outbox_pipelines.core.oncall.sweep import sweep
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.orders.broker_sim import BackgroundServer
from outbox_pipelines_tests.api.conftest import order, post_order
from outbox_pipelines_tests.conftest import run_cli

TOKEN = "brk-tok-7d1e55c09a"


@pytest.fixture
def echoing_gateway() -> Iterator[str]:
    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        status = 400 if body.get("idempotency_key", "").endswith("-bad") else 503
        echoed = {
            "error": f"refused: Authorization: {request.headers.get('Authorization')}",
            "headers": dict(request.headers),
        }
        return web.Response(status=status, text=json.dumps(echoed), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = BackgroundServer(app)
    yield server.start() + "orders"
    server.stop()


def test_an_echoed_token_reaches_no_row_no_caller_no_alert_and_no_status(
    api, client, conn, db_url, cli_env, echoing_gateway, tmp_path
):
    for key in ("K-ECHO-1-bad", "K-ECHO-2"):
        assert post_order(client, order(key)).status_code == 201
    env = {**cli_env, "OUTBOX_BROKER_URL": echoing_gateway, "OUTBOX_BROKER_TOKEN": TOKEN}
    relayed = run_cli(env, "relay", "--table", "outbox_orders", "--once", "--json")
    assert relayed.returncode == 0, relayed.stderr
    report = json.loads(relayed.stdout)
    assert (report["dead"], report["retried"]) == (1, 1), report

    texts = {"relay output": relayed.stdout + relayed.stderr}
    for table in ("outbox_orders", "outbox_audit", "outbox_destination_health", "idempo_ledger"):
        texts[table] = json.dumps(conn.execute(f"SELECT * FROM {table}").fetchall(), default=str)
    assert "refused: Authorization" in texts["outbox_orders"]  # operators still see what the gateway said...
    texts["GET /do/order"] = client.get("/do/order/K-ECHO-1-bad").text
    texts["replayed POST"] = post_order(client, order("K-ECHO-1-bad")).text
    texts["status --json"] = run_cli(env, "status", "--json").stdout
    texts["status"] = run_cli(env, "status").stdout
    settings = load_settings(env={"OUTBOX_BROKER_URL": echoing_gateway}, path=None)
    table = settings.table("outbox_orders")
    conn.execute("UPDATE outbox_destination_health SET failing_since = now() - interval '10 minutes'")
    verdicts = evaluate_checks(read_status(OutboxTable(conn, "outbox_orders")), table.checks)
    texts["check metadata"] = json.dumps([(v.description, v.metadata) for v in verdicts], default=str)
    alerts = sweep(db_url, settings).alerts
    assert any(a.get("check") == "destination" for a in alerts)
    texts["alerts"] = json.dumps(alerts, default=str)

    for where, text in texts.items():
        assert TOKEN not in text, f"the broker token reached {where}"
    reason = json.loads(texts["GET /do/order"])["reason"]
    assert reason == "BROKER_REJECTED: BAD_REQUEST: HTTP 400, the broker refused the order"  # ...callers, codes
