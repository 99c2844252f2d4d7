"""A real RabbitMQ node (Debian's ``rabbitmq-server`` package) for the tests, the drill and the bench.

Each ``RabbitMQ`` is a node of its own, started as a child process and stopped by its process id:

- its own node name (``outbox-<pid>-<n>@localhost``), AMQP port, distribution port, Erlang cookie
  (``HOME`` is the node's temp dir) and data, log and config files in that temp dir: two test
  workers, each starting a node at the same moment, share nothing;
- its own ``epmd`` on a free port (``ERL_EPMD_PORT``), started here in the foreground and stopped by
  its pid. Left to itself, Erlang would start ``epmd -daemon`` on port 4369, shared by every node of
  the machine and never stopped: the first test's daemon would outlive the session;
- the server script run directly (``/usr/lib/rabbitmq/bin/rabbitmq-server``), not ``/usr/sbin``'s
  wrapper, which ``su``s to the ``rabbitmq`` user and logs to /var/log; as root the node runs as root
  (RabbitMQ allows it). The script stays as the parent of the Erlang VM and turns SIGTERM into an
  orderly stop; it leads a session of its own, so what outlives a stop is killed by that session id;
- no plugins (the management plugin costs about a second at boot), listening on 127.0.0.1 only.

``stop()`` then ``start()`` brings the same node back on the same port with the same data (a durable
queue keeps its persistent messages): the outage drill's broker that went away and came back.
Users are created at boot from a definitions file (``users``), or later with ``ctl("add_user", ...)``.

Boot takes 3-4 s on 2 cores to the first AMQP handshake (measured: 3.2-4.6 s alone, 5.2 s each when two
test workers boot a node at once, up to 6 s on a busy machine), so tests share one node per module.
"""

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from outbox_pipelines_tests.processes import free_port, stop_process

SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
INSTALL_HINT = (
    "RabbitMQ is not installed: `apt-get install rabbitmq-server` (Debian/Ubuntu; its service need not "
    "run: the tests start nodes of their own), or run `bash .ci/run`"
)
# The AMQP 0-9-1 protocol header: a node that answers it with Connection.Start (a method frame, type 1) is ready.
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_started = 0


def installed() -> bool:
    return SERVER_SCRIPT.exists() and CTL_SCRIPT.exists() and shutil.which("epmd") is not None


def password_hash(password: str) -> str:
    """RabbitMQ's default password hash (rabbit_password_hashing_sha256): base64(salt + sha256(salt + password))."""
    salt = secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def amqp_answers(port: int, timeout_s: float = 1.0) -> bool:
    """True when a node on ``port`` answers the AMQP protocol header with Connection.Start."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(_PROTOCOL_HEADER)
            return sock.recv(1) == b"\x01"
    except OSError:
        return False


class RabbitMQ:
    """One RabbitMQ node: ``url`` (the administrator ``outbox`` user's), ``url_for(user)``, ``stop``/``start``.

    ``users`` maps extra user names to passwords; each gets all permissions on ``/`` unless ``permissions``
    names its (configure, write, read) patterns, or None: a user that can log in but not open the vhost.
    ``max_message_size`` is the node's limit in bytes (RabbitMQ closes the channel of a bigger message).
    """

    PASSWORD = "outbox-secret-pw"

    def __init__(
        self,
        *,
        max_message_size: int | None = None,
        users: Mapping[str, str] | None = None,
        permissions: Mapping[str, tuple[str, str, str] | None] | None = None,
        prefix: str = "outbox-rabbitmq-",
    ) -> None:
        if not installed():
            raise RuntimeError(INSTALL_HINT)
        global _started
        _started += 1
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.nodename = f"outbox-{os.getpid()}-{_started}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.users = {"outbox": self.PASSWORD, **(users or {})}
        self._write_files(max_message_size, permissions or {})
        self.log_path = self.dir / "server.out"
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.boot_seconds: list[float] = []
        self.start()

    # -- files -----------------------------------------------------------------

    def _write_files(
        self, max_message_size: int | None, permissions: Mapping[str, tuple[str, str, str] | None]
    ) -> None:
        granted = {name: permissions.get(name, (".*", ".*", ".*")) for name in self.users}
        definitions = {
            "vhosts": [{"name": "/"}],
            "users": [
                {
                    "name": name,
                    "password_hash": password_hash(password),
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": ["administrator"] if name == "outbox" else [],
                }
                for name, password in self.users.items()
            ],
            "permissions": [
                {"user": name, "vhost": "/", "configure": p[0], "write": p[1], "read": p[2]}
                for name, p in granted.items()
                if p is not None
            ],
        }
        (self.dir / "definitions.json").write_text(json.dumps(definitions))
        config = [
            f"listeners.tcp.default = 127.0.0.1:{self.port}",
            # Users come from the definitions only: no guest user.
            f"load_definitions = {self.dir / 'definitions.json'}",
            "log.console = false",
            "log.file.level = info",
            # The outage drill stops the node for a minute; the tests' disks may be small.
            "disk_free_limit.absolute = 50MB",
        ]
        if max_message_size is not None:
            config.append(f"max_message_size = {max_message_size}")
        (self.dir / "rabbitmq.conf").write_text("\n".join(config) + "\n")
        (self.dir / "enabled_plugins").write_text("[].\n")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.dir),  # the Erlang cookie lives here: this node's and its rabbitmqctl's only
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.dir / "rabbitmq.pid"),
            # Debian's /etc/rabbitmq/rabbitmq-env.conf may name the node or its paths: not read.
            RABBITMQ_CONF_ENV_FILE=str(self.dir / "rabbitmq-env.conf"),
            ERL_CRASH_DUMP=str(self.dir / "erl_crash.dump"),
            # The distribution listener on loopback only, like AMQP.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )
        return env

    # -- life cycle --------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.url_for("outbox")

    def url_for(self, user: str, password: str | None = None) -> str:
        return f"amqp://{user}:{password if password is not None else self.users[user]}@127.0.0.1:{self.port}/"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _start_epmd(self) -> None:
        if self.epmd is not None and self.epmd.poll() is None:
            return
        self.epmd = subprocess.Popen(
            ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.epmd_port), timeout=0.5).close()
                return
            except OSError:
                if self.epmd.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"epmd on port {self.epmd_port} did not start") from None
                time.sleep(0.02)

    def start(self, timeout_s: float = 60.0) -> float:
        """Boot the node (again: same name, port and data); the seconds it took to answer AMQP."""
        if self.running:
            return 0.0
        self._start_epmd()
        began = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(SERVER_SCRIPT)],
                cwd=self.dir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = began + timeout_s
        while not amqp_answers(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"rabbitmq-server did not answer AMQP on {self.port} within {timeout_s:g} s:\n{self.log()}"
                )
            time.sleep(0.05)
        seconds = time.monotonic() - began
        self.boot_seconds.append(seconds)
        return seconds

    def stop(self, *, kill: bool = False, timeout_s: float = 30.0) -> None:
        """Stop the node by its pid (SIGTERM: an orderly stop; ``kill``: SIGKILL to its session, a crash).

        epmd is kept (it is ours, and a restart finds it); ``close`` stops it."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        if kill:
            self._kill_session(process.pid)
        else:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_session(process.pid)
            process.wait(timeout=10)
        # The VM is the script's child in the same session: anything left of it goes too.
        self._kill_session(process.pid)
        deadline = time.monotonic() + 10
        while amqp_answers(self.port, timeout_s=0.2) and time.monotonic() < deadline:
            time.sleep(0.05)

    @staticmethod
    def _kill_session(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)  # the session (and process group) our child leads: its id is its pid
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Stop the node and its epmd (both by pid) and remove the temp dir. The node is killed: its data is
        removed next, and an orderly stop took up to 30 s with a client connected."""
        try:
            self.stop(kill=True)
        finally:
            stop_process(self.epmd, grace_s=5)
            if not os.environ.get("OUTBOX_RABBITMQ_KEEP_TMP"):
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RabbitMQ":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- inspection ----------------------------------------------------------------

    def ctl(self, *args: str, timeout_s: float = 30.0) -> str:
        """``rabbitmqctl <args>`` against this node (its name, epmd and cookie); its output, or RuntimeError."""
        env = self._env()
        # rabbitmqctl's own distribution port: 35672-35682 by default, shared by every node's tools.
        port = free_port()
        env.update(RABBITMQ_CTL_DIST_PORT_MIN=str(port), RABBITMQ_CTL_DIST_PORT_MAX=str(port))
        done = subprocess.run(
            [str(CTL_SCRIPT), *args],
            cwd=self.dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def version(self) -> str:
        return self.ctl("version").strip()

    def log(self, lines: int = 40) -> str:
        text = ""
        for path in (self.log_path, self.dir / "log" / f"{self.nodename}.log"):
            if path.exists():
                text += f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text


# -- a consumer's side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One message as a consumer read it from a queue."""

    message_id: str | None
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    delivery_mode: int | None
    content_type: str | None
    redelivered: bool


def _received(message: DeliveredMessage) -> Received:
    properties = message.header.properties
    delivery = message.delivery
    return Received(
        properties.message_id,
        str(getattr(delivery, "routing_key", "")),
        message.body,
        dict(properties.headers or {}),
        properties.delivery_mode,
        properties.content_type,
        bool(getattr(delivery, "redelivered", False)),
    )


def _tag(message: DeliveredMessage) -> int:
    tag = getattr(message.delivery, "delivery_tag", None)
    assert isinstance(tag, int), message.delivery
    return tag


def bind_queue(url: str, exchange: str, queue: str, *keys: str, arguments: dict[str, Any] | None = None) -> None:
    """Declare the durable topic exchange (as the destination does) and a durable queue bound to it by ``keys``
    (``#`` when none): what the consumers' side sets up."""

    async def run() -> None:
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel()
            await channel.exchange_declare(exchange, exchange_type="topic", durable=True)
            await channel.queue_declare(queue, durable=True, arguments=arguments)
            for key in keys or ("#",):
                await channel.queue_bind(queue, exchange, routing_key=key)
        finally:
            await connection.close()

    asyncio.run(run())


def drain_queue(url: str, queue: str) -> list[Received]:
    """Every message waiting in ``queue``, read with basic.get and acknowledged, in queue order."""

    async def run() -> list[Received]:
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel()
            got: list[Received] = []
            while True:
                message = await channel.basic_get(queue)
                if isinstance(message.delivery, spec.Basic.GetEmpty):
                    return got
                got.append(_received(message))
                await channel.basic_ack(_tag(message))
        finally:
            await connection.close()

    return asyncio.run(run())


class Consumer:
    """A consumer on a thread of its own, reading ``queue`` with manual acks (prefetch 200) and keeping every
    message_id it read, in order. It outlives the broker: when the connection goes, it connects again every
    0.2 s until the node is back, as a real consumer would; a message read but not acknowledged before an
    outage comes again (``redelivered``)."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.read: list[Received] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name=f"consumer-{queue}", daemon=True)
        self._thread.start()

    async def _on_message(self, message: DeliveredMessage) -> None:
        self.read.append(_received(message))
        await message.channel.basic_ack(_tag(message))

    def ids(self) -> list[str | None]:
        return [r.message_id for r in list(self.read)]

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                connection = await asyncio.wait_for(aiormq.connect(self.url), 5)
            except Exception:  # the broker is away: try again
                await asyncio.sleep(0.2)
                continue
            try:
                channel = await connection.channel()
                await channel.basic_qos(prefetch_count=200)
                await channel.basic_consume(self.queue, self._on_message)
                while not self._stop.is_set() and not connection.is_closed:
                    await asyncio.sleep(0.05)
            except Exception:  # the connection went mid-way
                pass
            finally:
                if not connection.is_closed:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(connection.close(), 2)
            if not self._stop.is_set():
                self.reconnects += 1
                await asyncio.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
