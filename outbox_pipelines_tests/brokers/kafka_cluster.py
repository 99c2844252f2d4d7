"""A Kafka cluster for the tests, drill and bench: librdkafka's own mock cluster, in a process of its own.

Why the mock cluster: no Kafka server can be installed here (no JVM package, no internet but package
registries), and a hand-written fake broker is not allowed. librdkafka (bundled in confluent-kafka's wheel)
carries a mock cluster that speaks the real Kafka protocol to real clients: metadata, produce with
idempotence (producer ids, sequence numbers), fetch, topic auto-creation. The destination under test and
the tests' consumers are the real confluent-kafka clients talking to it over TCP.

How it is hosted: confluent-kafka does not wrap librdkafka's mock API (no MockCluster class; a client
configured with ``test.mock.num.brokers`` builds a cluster only it can steer). The shared library does
export it (``rd_kafka_mock_*``), so this module, run as a program, loads the very library confluent-kafka
bundles with ctypes, creates a bare rd_kafka_t and a mock cluster on it, prints the brokers' bootstrap
address as a JSON line, and then takes commands, one line each, on stdin: brokers down/up (a broker that
is down closes its connections and its listener: clients get "connection refused", as from a stopped
broker), topics created with a partition count, errors injected the way a broker answers them (a topic's
metadata error, a partition's produce error). It exits when stdin closes, so a test that dies takes its
cluster with it; the test side (``KafkaCluster``) stops it by its process id.

What the mock does not do: it keeps records in memory only (a "down" broker keeps them, like a broker
whose log survived a restart), it enforces no size limit and no ACLs itself (those refusals are injected
as the broker's error codes), and it creates any topic a client's metadata request asks it to when the
client allows auto-creation (a real broker also needs ``auto.create.topics.enable``): the tests stand for
a broker that refuses a topic with ``topic_error(topic, UNKNOWN_TOPIC_OR_PART)``.
"""

import ctypes
import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from outbox_pipelines_tests.processes import stop_process

# Kafka protocol request types (ApiKey) the tests inject errors into.
PRODUCE = 0
METADATA = 3
INIT_PRODUCER_ID = 22


def _library() -> ctypes.CDLL:
    """The librdkafka confluent-kafka bundles (the one its clients use), with the mock API's signatures."""
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(glob.glob(str(libs / "librdkafka*.so*")))
    lib = ctypes.CDLL(found[0] if found else "librdkafka.so.1")
    p, i, i16, s, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_int16, ctypes.c_char_p, ctypes.c_size_t
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "rd_kafka_conf_new": (p, []),
        "rd_kafka_conf_set": (i, [p, s, s, s, sz]),
        "rd_kafka_new": (p, [i, p, s, sz]),
        "rd_kafka_mock_cluster_new": (p, [p, i]),
        "rd_kafka_mock_cluster_bootstraps": (s, [p]),
        "rd_kafka_mock_broker_set_down": (i, [p, ctypes.c_int32]),
        "rd_kafka_mock_broker_set_up": (i, [p, ctypes.c_int32]),
        "rd_kafka_mock_broker_set_rtt": (i, [p, ctypes.c_int32, i]),
        "rd_kafka_mock_topic_create": (i, [p, s, i, i]),
        "rd_kafka_mock_topic_set_error": (None, [p, s, i]),
        "rd_kafka_mock_push_request_errors_array": (None, [p, i16, sz, ctypes.POINTER(i)]),
        "rd_kafka_mock_clear_request_errors": (None, [p, i16]),
        "rd_kafka_err2name": (s, [i]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


class _Host:
    """The mock cluster inside this process, steered by one-line commands."""

    def __init__(self, brokers: int) -> None:
        self.lib = _library()
        self.brokers = brokers
        conf = self.lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        # The handle only carries the cluster: it connects nowhere, so it needs no bootstrap servers (and
        # should not warn about them).
        self.lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, 512)
        self.rk = self.lib.rd_kafka_new(0, conf, errstr, 512)  # RD_KAFKA_PRODUCER
        if not self.rk:
            raise RuntimeError(errstr.value.decode())
        self.cluster = self.lib.rd_kafka_mock_cluster_new(self.rk, brokers)
        if not self.cluster:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap = self.lib.rd_kafka_mock_cluster_bootstraps(self.cluster).decode()

    def _brokers(self, which: str) -> list[int]:
        return list(range(1, self.brokers + 1)) if which == "all" else [int(which)]

    def command(self, words: list[str]) -> str:
        lib, cluster = self.lib, self.cluster
        verb, args = words[0], words[1:]
        if verb in ("down", "up"):
            call = lib.rd_kafka_mock_broker_set_down if verb == "down" else lib.rd_kafka_mock_broker_set_up
            return self._codes(call(cluster, broker) for broker in self._brokers(args[0]))
        if verb == "rtt":
            rtt = lib.rd_kafka_mock_broker_set_rtt
            return self._codes(rtt(cluster, broker, int(args[1])) for broker in self._brokers(args[0]))
        if verb == "create":
            return self._codes(
                [lib.rd_kafka_mock_topic_create(cluster, args[0].encode(), int(args[1]), min(3, self.brokers))]
            )
        if verb == "topic_error":
            lib.rd_kafka_mock_topic_set_error(cluster, args[0].encode(), int(args[1]))
            return "ok"
        if verb == "request_errors":
            codes = [int(code) for code in args[1:]]
            lib.rd_kafka_mock_push_request_errors_array(
                cluster, int(args[0]), len(codes), (ctypes.c_int * len(codes))(*codes)
            )
            return "ok"
        if verb == "partition_errors":
            # Variadic in C (topic, partition, ApiKey, count, codes...): ctypes passes the ints as C ints.
            topic, partition, api_key = args[0].encode(), int(args[1]), int(args[2])
            errors = [ctypes.c_int(int(code)) for code in args[3:]]
            function = lib.rd_kafka_mock_partition_push_request_errors
            function.restype = ctypes.c_int
            return self._codes(
                [
                    function(
                        ctypes.c_void_p(cluster),
                        topic,
                        ctypes.c_int32(partition),
                        ctypes.c_int16(api_key),
                        ctypes.c_size_t(len(errors)),
                        *errors,
                    )
                ]
            )
        if verb == "clear_errors":
            lib.rd_kafka_mock_clear_request_errors(cluster, int(args[0]))
            return "ok"
        return f"error unknown command {verb!r}"

    def _codes(self, codes: Any) -> str:
        failed = [self.lib.rd_kafka_err2name(code).decode() for code in codes if code]
        return "error " + ",".join(failed) if failed else "ok"


def serve(brokers: int, stdin: IO[str], stdout: IO[str]) -> None:
    host = _Host(brokers)
    print(json.dumps({"bootstrap": host.bootstrap, "pid": os.getpid()}), file=stdout, flush=True)
    for line in stdin:  # ends when the test closes stdin, or dies
        words = line.split()
        if not words:
            continue
        try:
            answer = host.command(words)
        except (ValueError, IndexError) as exc:
            answer = f"error {exc}"
        print(answer, file=stdout, flush=True)


class KafkaCluster:
    """A mock Kafka cluster in a child process: ``bootstrap`` is its ``host:port,...``; stopped by its pid."""

    def __init__(self, brokers: int = 3) -> None:
        self.brokers = brokers
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox_pipelines_tests.brokers.kafka_cluster", str(brokers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        first = self.process.stdout.readline()
        if not first:
            self.process.wait(timeout=10)
            raise RuntimeError(f"the mock Kafka cluster exited with {self.process.returncode} before it started")
        started = json.loads(first)
        self.bootstrap: str = started["bootstrap"]
        self.pid: int = started["pid"]

    def command(self, *words: object) -> None:
        """Run one command in the cluster process; RuntimeError when the mock refused it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(" ".join(str(word) for word in words) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"mock cluster: {' '.join(map(str, words))}: {answer or 'no answer'}")

    def create_topic(self, topic: str, partitions: int) -> None:
        self.command("create", topic, partitions)

    def brokers_down(self) -> None:
        """Every broker closes its connections and its listener (clients get "connection refused")."""
        self.command("down", "all")

    def brokers_up(self) -> None:
        self.command("up", "all")

    def topic_error(self, topic: str, code: int) -> None:
        """Metadata requests for ``topic`` answer ``code`` (UNKNOWN_TOPIC_OR_PART, TOPIC_AUTHORIZATION_FAILED)."""
        self.command("topic_error", topic, code)

    def partition_errors(self, topic: str, partition: int, api_key: int, *codes: int) -> None:
        """The next requests of ``api_key`` for this partition answer ``codes``, one request each."""
        self.command("partition_errors", topic, partition, api_key, *codes)

    def request_errors(self, api_key: int, *codes: int) -> None:
        """The next requests of ``api_key`` (any broker) answer ``codes``, one request each."""
        self.command("request_errors", api_key, *codes)

    def freeze(self) -> None:
        """SIGSTOP the cluster process: brokers keep their sockets but answer nothing (a hung broker)."""
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            stop_process(self.process, grace_s=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> "KafkaCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Record:
    """One record as a consumer read it."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: dict[str, str]


def _headers(raw: Any) -> dict[str, str]:
    pairs = raw.items() if isinstance(raw, dict) else (raw or [])
    return {name: value.decode() if isinstance(value, bytes) else str(value) for name, value in pairs}


def read_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[Record]:
    """Every record of ``topic`` now, read by a real consumer from the start of each partition up to its
    high watermark (no waiting on a guess of how many will come); [] for a topic that does not exist."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"outbox-test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return []
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in found.partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        waiting = {p for p, end in ends.items() if end > 0}
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(waiting)} not read to their end in {timeout_s} s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consumer: {error}")
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            key, value = msg.key(), msg.value()
            records.append(
                Record(
                    topic,
                    partition,
                    offset,
                    key.decode() if isinstance(key, bytes) else key,
                    value if isinstance(value, bytes) else (value or "").encode(),
                    _headers(msg.headers()),
                )
            )
            if offset + 1 >= ends[partition]:
                waiting.discard(partition)
        return records
    finally:
        consumer.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 3, sys.stdin, sys.stdout)
