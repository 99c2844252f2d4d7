"""The Order API served for real: uvicorn on 127.0.0.1 in a background thread, httpx against it.

``start_api(**settings)`` serves a fresh app (its own rate limiter, tokens, body
limit) and stops it at teardown; ``api`` is the module's default one (open,
generous rate limit). Each test module has one database, emptied after every
test. ``broker_sim(**faults)`` starts the local broker. Helpers post orders and
read what was stored.
"""

import dataclasses
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from opentelemetry import trace

from outbox_pipelines.core.settings import Settings, load_settings
from outbox_pipelines.core.telemetry import metrics
from outbox_pipelines.orders.api.app import ApiSettings, create_app
from outbox_pipelines.orders.broker_sim import BrokerSim, Faults
from outbox_pipelines_tests.helpers import order_payload, rows


@dataclasses.dataclass
class LiveApi:
    url: str
    settings: ApiSettings
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15, trust_env=False, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the API server did not stop"


def serve(app: Any) -> tuple[str, uvicorn.Server, threading.Thread]:
    """Serve an ASGI app on a socket bound here (no free-port race); return once it accepts requests."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # proxy_headers=False: the app alone decides whom to believe about X-Forwarded-For
    # (ApiSettings.trusted_proxies). uvicorn's default would rewrite the peer of any request from
    # 127.0.0.1 from a client-written X-Forwarded-For before the app sees it.
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on", proxy_headers=False
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"order-api-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the Order API did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="module")
def module_db(pg_server: Any) -> Iterator[str]:
    name, url = pg_server.create_database()
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def db_url(module_db: str) -> Iterator[str]:
    """This module's database, emptied after each test.

    (A database per module, not per test: cloning one costs ~0.3 s, and the API
    tests are many and short.)"""
    yield module_db
    with psycopg.connect(module_db, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("TRUNCATE idempo_ledger, outbox_orders, outbox_audit RESTART IDENTITY")


class ApiServers:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.started: list[LiveApi] = []

    def start(self, tracer_provider: Any = None, **overrides: Any) -> LiveApi:
        """An API on this database with ``overrides`` of ApiSettings; its spans go to ``tracer_provider``
        (default: a no-op one, whatever global provider another test may have installed)."""
        settings = ApiSettings(database_url=self.database_url, **{"rate_per_minute": 10_000, **overrides})
        provider = tracer_provider if tracer_provider is not None else trace.NoOpTracerProvider()
        url, server, thread = serve(create_app(settings, tracer_provider=provider))
        live = LiveApi(url, settings, server, thread)
        self.started.append(live)
        return live

    def stop_all(self) -> None:
        for live in reversed(self.started):
            live.stop()


@pytest.fixture
def start_api(db_url: str) -> Iterator[Callable[..., LiveApi]]:
    """Start an API of its own (tokens, rate limit, body limit ...) for this test only."""
    servers = ApiServers(db_url)
    yield servers.start
    servers.stop_all()


@pytest.fixture(scope="module")
def module_api(module_db: str) -> Iterator[LiveApi]:
    servers = ApiServers(module_db)
    yield servers.start()
    servers.stop_all()


@pytest.fixture
def api(module_api: LiveApi, db_url: str) -> LiveApi:
    """The default API (open, 10,000 requests a minute), shared by this module's tests."""
    return module_api


@pytest.fixture
def client(api: LiveApi) -> Iterator[httpx.Client]:
    with api.client() as c:
        yield c


@pytest.fixture
def broker_sim() -> Iterator[Callable[..., BrokerSim]]:
    """Start a BrokerSim (real sockets) with the given Faults; stopped at teardown."""
    sims: list[BrokerSim] = []

    def start(**faults: Any) -> BrokerSim:
        sim = BrokerSim(Faults(**faults)).start_in_thread()
        sims.append(sim)
        return sim

    yield start
    for sim in sims:
        sim.stop()


# -- helpers ---------------------------------------------------------------------------------------
def order(key: str = "01JABCXYZ-ULID-5678", i: int = 1, **fields: Any) -> dict[str, Any]:
    """A valid OrderRequest v1.1 for ``key``; ``fields`` override or add (None values stay as null)."""
    body = order_payload(i, key)
    body.update(fields)
    return body


def raw(number_text: str) -> str:
    """A JSON number written as is (1e400, 10**400 ...), where Python's json would not write it."""
    return f"<raw:{number_text}>"


def dumps(body: Any) -> bytes:
    """JSON as a client sends it: non-ASCII escaped (a lone surrogate travels as \\ud800), raw() numbers spliced in."""
    return re.sub(r'"<raw:([^>"]+)>"', r"\1", json.dumps(body)).encode()


def post_order(client: httpx.Client, body: Any, key: str | None = "<body>", **headers: str) -> httpx.Response:
    """POST /do/order with Idempotency-Key = body.idempotency_key unless ``key`` says otherwise (None: no header).

    ``headers`` are given as X_Trace_Id="..." (underscores become dashes)."""
    sent = {"Content-Type": "application/json"}
    if key == "<body>":
        key = body.get("idempotency_key") if isinstance(body, dict) else None
    if key is not None:
        sent["Idempotency-Key"] = key
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    return client.post("/do/order", content=dumps(body), headers=sent)


def post_raw(
    client: httpx.Client, content: bytes, key: str = "k-raw", content_type: str = "application/json", **headers: str
) -> httpx.Response:
    return client.post(
        "/do/order", content=content, headers={"Content-Type": content_type, "Idempotency-Key": key, **headers}
    )


def ledger(conn: psycopg.Connection, where: str = "true") -> list[dict]:
    return conn.execute(f"SELECT * FROM idempo_ledger WHERE {where} ORDER BY created_at, idempotency_key").fetchall()


def assert_nothing_stored(conn: psycopg.Connection) -> None:
    assert ledger(conn) == []
    assert rows(conn, "outbox_orders") == []


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def paper_settings() -> Settings:
    """The shipped settings with no environment and no config file: outbox_orders → the paper broker."""
    return load_settings(env={}, path=None)


def broker_settings(url: str) -> Settings:
    """The shipped settings with outbox_orders sent to the broker at ``url``."""
    settings = load_settings(env={}, path=None)
    table = dataclasses.replace(settings.table("outbox_orders"), url=url)
    return dataclasses.replace(settings, tables={**settings.tables, "outbox_orders": table})


def sample(name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples in this process whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in metrics.REGISTRY.collect():
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                total += found.value
    return total
