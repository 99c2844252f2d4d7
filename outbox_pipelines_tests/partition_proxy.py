"""A TCP proxy on 127.0.0.1 in front of the test PostgreSQL that the test can partition: a network outage where
every connection stays open and nothing answers (no RST, no FIN), as a dropped route or a firewall leaves it.

``partition()`` black-holes it: the proxy stops forwarding both ways, keeps every socket open, and accepts new
connections without forwarding a byte of them (a connect then waits for the server's answer). ``heal()``
forwards again what was held. ``partition_at_next_query()`` lets connections start (the startup and the
authentication pass) and partitions at the first query a client sends: the client is then waiting for the
answer to a statement, as a command caught by an outage is.

Run in this process on threads; ``close()`` (or leaving the ``with`` block) closes every socket it opened.
"""

import os
import selectors
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

import psycopg

from outbox_pipelines.core.storage.database_url import psycopg_url

# Client messages that start a statement (simple query, extended protocol's Parse); the startup packet and the
# password messages that come before them never start with these bytes.
_QUERY_STARTS = (b"Q", b"P")
# The server's ReadyForQuery message ('Z', length 5, a transaction status): the end of every answer.
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
_SLICE_S = 0.05


class PartitionProxy:
    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = psycopg_url(upstream_url)
        info = psycopg.conninfo.conninfo_to_dict(self.upstream_url)
        host, port = str(info.get("host") or "/tmp"), str(info.get("port") or "5432")
        if host.startswith("/"):  # a Unix socket directory (the embedded server)
            self._upstream: tuple[int, str | tuple[str, int]] = (socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}"))
        else:
            self._upstream = (socket.AF_INET, (host, int(port)))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._partitioned = threading.Event()
        self._at_next_query = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0  # accepted so far
        self._waiting: set[int] = set()  # connections whose client sent something during the partition
        # Connections whose client sent something that the server has not answered in full (no ReadyForQuery since).
        self._unanswered: set[int] = set()
        self._accepting = threading.Thread(target=self._accept, daemon=True, name="partition-proxy")
        self._accepting.start()

    # -- what a test does ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The upstream URL, through the proxy: same user, password and database, host 127.0.0.1:port."""
        parts = urlsplit(self.upstream_url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("the proxy needs the test database as a postgresql:// URL")
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        query = "&".join(p for p in parts.query.split("&") if p and not p.startswith(("host=", "port=")))
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))

    def partition(self) -> None:
        self._partitioned.set()

    def partition_at_next_query(self) -> None:
        self._at_next_query.set()

    def heal(self) -> None:
        self._at_next_query.clear()
        self._partitioned.clear()
        with self._lock:
            self._waiting.clear()

    @property
    def waiting_clients(self) -> int:
        """Connections whose client waits on a statement during the partition: one it sent since the partition
        began, or one it sent before whose answer the partition holds (a statement caught in flight)."""
        with self._lock:
            return len(self._waiting | self._unanswered) if self._partitioned.is_set() else len(self._waiting)

    @property
    def partitioned(self) -> bool:
        return self._partitioned.is_set()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()
        self._accepting.join(timeout=5)

    def __enter__(self) -> "PartitionProxy":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the forwarding --------------------------------------------------------------------------------------
    def _accept(self) -> None:
        self._listener.settimeout(_SLICE_S)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="partition-proxy-conn").start()

    def _serve(self, client: socket.socket) -> None:
        self._keep(client)
        while self._partitioned.is_set():  # a connect during a partition: accepted, and nothing comes back
            if self._closed.wait(_SLICE_S):
                return
        family, address = self._upstream
        server = socket.socket(family, socket.SOCK_STREAM)
        self._keep(server)
        try:
            server.connect(address)
        except OSError:
            client.close()
            return
        self._pump(client, server)

    def _note_waiting(self, client: socket.socket) -> None:
        with self._lock:
            self._waiting.add(id(client))

    def _note_unanswered(self, client: socket.socket, unanswered: bool) -> None:
        with self._lock:
            if unanswered:
                self._unanswered.add(id(client))
            else:
                self._unanswered.discard(id(client))

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        """Both directions on this thread; while partitioned, nothing is read (the kernel keeps what arrives)."""
        try:
            self._forward(client, server)
        finally:
            self._note_unanswered(client, False)  # closed: nothing waits on it any more

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        answered = b""  # the server's last bytes: its answer is whole when they are a ReadyForQuery
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ)
            selector.register(server, selectors.EVENT_READ)
            while not self._closed.is_set():
                if self._partitioned.is_set():
                    if any(key.fileobj is client for key, _ in selector.select(0)):
                        self._note_waiting(client)  # it sent something that will get no answer
                    self._closed.wait(_SLICE_S)
                    continue
                for key, _ in selector.select(_SLICE_S):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        client.close()
                        server.close()
                        return
                    if source is client and self._at_next_query.is_set() and data[:1] in _QUERY_STARTS:
                        self._partitioned.set()  # the query is held: its client waits for an answer
                        self._at_next_query.clear()
                        self._note_waiting(client)
                        self._hold_until_healed(data, server)
                        break
                    try:
                        peer[source].sendall(data)
                    except OSError:
                        client.close()
                        server.close()
                        return
                    if source is client:
                        self._note_unanswered(client, True)
                    elif (answered := (answered + data)[-6:])[:5] == _READY_FOR_QUERY:
                        self._note_unanswered(client, False)

    def _hold_until_healed(self, data: bytes, server: socket.socket) -> None:
        while self._partitioned.is_set():
            if self._closed.wait(_SLICE_S):
                return
        try:
            server.sendall(data)
        except OSError:
            pass
