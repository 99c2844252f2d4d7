"""A destination that cannot be reached says why, with its own code, on every client: a refused connection
(nothing listens: a closed port), a TLS handshake that fails (a server with a self-signed certificate), a
server that accepts and never answers (a timeout), a host name that does not resolve. Real sockets, each
server started here and stopped by the test."""

import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from outbox_pipelines.core.destinations.http.destination import TRANSPORTS
from outbox_pipelines.core.destinations.nats.jetstream import NatsJetStreamDestination
from outbox_pipelines.core.destinations.rabbitmq.destination import RabbitMQDestination
from outbox_pipelines.core.relay.destination_health import DESTINATION_FAILURES
from outbox_pipelines_tests.core.destinations.http.test_http import claimed, deliver_one
from outbox_pipelines_tests.processes import free_port


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (no client trusts it)."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextmanager
def listening(handle) -> Iterator[int]:
    """A server on 127.0.0.1 that gives each accepted connection to ``handle`` in a thread; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        for conn in accepted:
            conn.close()
        thread.join(5)


@pytest.fixture
def tls_server(certificate) -> Iterator[int]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)

    def handshake(conn: socket.socket) -> None:
        try:
            context.wrap_socket(conn, server_side=True).recv(1024)
        except OSError:
            pass  # the client refuses the certificate and hangs up

    with listening(handshake) as port:
        yield port


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts, reads, never answers."""

    def swallow(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    with listening(swallow) as port:
        yield port


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_http_transport_names_why_it_could_not_reach_the_destination(transport, tls_server, silent_server):
    refused = deliver_one(f"http://127.0.0.1:{free_port()}/", transport, timeout_s=2)
    assert (refused.kind, refused.code) == ("retry", "CONNECTION_REFUSED"), refused
    assert "nothing listens at that host and port" in refused.error

    tls = deliver_one(f"https://127.0.0.1:{tls_server}/", transport, timeout_s=2)
    assert (tls.kind, tls.code) == ("retry", "TLS_ERROR"), tls
    assert "TLS handshake failed" in tls.error and "CERTIFICATE_VERIFY_FAILED" in tls.error

    silent = deliver_one(f"http://127.0.0.1:{silent_server}/", transport, timeout_s=0.5)
    assert (silent.kind, silent.code) == ("retry", "NETWORK_TIMEOUT"), silent
    assert "no answer within 0.5 s" in silent.error

    unknown = deliver_one("http://no-such-host.invalid/", transport, timeout_s=2)
    assert (unknown.kind, unknown.code) == ("retry", "DNS_ERROR"), unknown
    assert "does not resolve" in unknown.error


def test_every_network_code_counts_toward_the_circuit():
    assert {"CONNECTION_REFUSED", "TLS_ERROR", "DNS_ERROR", "NETWORK_TIMEOUT", "CONNECTION_LOST"} <= (
        DESTINATION_FAILURES
    )


def test_the_brokers_clients_name_a_refused_connection_too(silent_server):
    closed = free_port()
    rabbit = RabbitMQDestination(f"amqp://guest:guest@127.0.0.1:{closed}/", exchange="crm", timeout_s=2)
    try:
        [outcome] = rabbit.deliver([claimed()])
    finally:
        rabbit.close()
    assert (outcome.kind, outcome.code) == ("retry", "CONNECTION_REFUSED"), outcome
    assert "guest:guest" not in (outcome.error or "")

    nats = NatsJetStreamDestination(f"nats://127.0.0.1:{closed}", timeout_s=2)
    try:
        [outcome] = nats.deliver([claimed()])
    finally:
        nats.close()
    assert (outcome.kind, outcome.code) == ("retry", "CONNECTION_REFUSED"), outcome
