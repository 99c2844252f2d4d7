"""Every connection the package opens has a connect timeout, TCP keepalives and a TCP user timeout (issue 42,
"nothing hangs"): read on the connection's own socket, through a real TCP proxy to the test database, and a
connect to a black-holed address fails within the connect timeout with a message that says so."""

import os
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest

from outbox_pipelines.core.errors import ConfigError, DatabaseUnavailable
from outbox_pipelines.core.relay.session import open_relay_session
from outbox_pipelines.core.storage import network_limits
from outbox_pipelines.core.storage.db import connect, driver_connection
from outbox_pipelines.defs.resources import OutboxDatabase
from outbox_pipelines.orders.api.dbguard import GuardedEngine, HealthProbe
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.partition_proxy import PartitionProxy

# (SO_KEEPALIVE, TCP_KEEPIDLE s, TCP_KEEPINTVL s, TCP_KEEPCNT, TCP_USER_TIMEOUT ms) as the defaults set them.
DEFAULTS = (1, 30, 10, 3, 60_000)


@pytest.fixture
def proxy(db_url: str) -> Iterator[PartitionProxy]:
    with PartitionProxy(db_url) as running:
        yield running


def tcp_options(conn: psycopg.Connection) -> tuple[int, int, int, int, int]:
    """What the kernel has for the connection's socket (a duplicate of its descriptor, closed after)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        assert sock.family == socket.AF_INET
        return (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        )
    finally:
        sock.close()


def test_our_connections_have_keepalives_and_a_user_timeout(proxy, monkeypatch):
    for name in ("OUTBOX_DB_KEEPALIVES_IDLE_S", "OUTBOX_DB_TCP_USER_TIMEOUT_MS", "PGCONNECT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    with connect(proxy.url) as conn:
        assert tcp_options(conn) == DEFAULTS
        assert conn.info.get_parameters()["connect_timeout"] == "10"
    session = open_relay_session(proxy.url, table_settings("outbox_orders"))  # the relay's, the keeper's
    try:
        assert tcp_options(session.conn) == DEFAULTS
    finally:
        session.conn.close()


def test_the_dagster_resource_and_the_order_api_engines_have_them_too(proxy):
    database = OutboxDatabase(url=proxy.url)
    guarded = GuardedEngine(proxy.url, pool_size=1, max_overflow=0, pool_timeout_s=5, timeout_s=5)
    probe = HealthProbe(proxy.url)
    try:
        for engine in (database.engine(), guarded.engine, probe.engine):
            with engine.connect() as conn:
                assert tcp_options(driver_connection(conn)) == DEFAULTS
    finally:
        database.close()
        guarded.dispose()
        probe.engine.dispose()


def test_the_settings_set_them_and_a_url_keeps_its_own(proxy, monkeypatch):
    monkeypatch.setenv("OUTBOX_DB_KEEPALIVES_IDLE_S", "7")
    monkeypatch.setenv("OUTBOX_DB_TCP_USER_TIMEOUT_MS", "4000")
    with connect(proxy.url) as conn:
        assert tcp_options(conn) == (1, 7, 10, 3, 4000)
    joiner = "&" if "?" in proxy.url else "?"
    with connect(proxy.url + joiner + "keepalives_idle=11&connect_timeout=4") as conn:
        assert tcp_options(conn)[1] == 11
        assert conn.info.get_parameters()["connect_timeout"] == "4"
    monkeypatch.setenv("OUTBOX_DB_KEEPALIVES_COUNT", "many")
    with pytest.raises(ConfigError, match="OUTBOX_DB_KEEPALIVES_COUNT='many' is not a whole number"):
        connect(proxy.url)
    monkeypatch.setenv("OUTBOX_DB_KEEPALIVES_COUNT", "0")
    with pytest.raises(ConfigError, match="OUTBOX_DB_KEEPALIVES_COUNT=0 must be at least 1"):
        network_limits.limits()


def test_a_connect_to_a_black_holed_address_times_out_with_a_message(proxy, monkeypatch):
    monkeypatch.setenv("OUTBOX_DB_CONNECT_TIMEOUT_S", "2")
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    proxy.partition()  # the proxy accepts and never answers
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="connection timeout expired") as caught:
        connect(proxy.url)
    took = time.monotonic() - started
    assert 1.5 <= took < 6, took
    assert f"127.0.0.1:{proxy.port}" in str(caught.value)
    assert proxy.connections >= 1
