"""The relay into each broker (NATS JetStream, RabbitMQ, Kafka's mock cluster) from two or more package trees in turns,
each against the broker client's own publish loop measured in the same round.

    .venv/bin/python bench/broker_paths.py /tmp/before [/tmp/other ...] [--runs 5] [--messages 10000]
    .venv/bin/python bench/broker_paths.py /tmp/before --only nats --runs 3

Each tree is a copy of the package (``git archive <commit> outbox_pipelines sql | tar -x -C /tmp/before``); this
tree is always measured too ("this"). One embedded PostgreSQL, one broker of each kind (started by the broker
modules of ``bench/obench``: ``broker_nats``, ``broker_rabbitmq``, ``broker_kafka``). Per round and broker: the
client loop the ``brokers`` scenario compares with (NATS: the faster of nats-py's two 32-in-flight loops;
RabbitMQ: aiormq, 32 in flight; Kafka: confluent-kafka flushing every 100), then the relay (batch 100, 32 in
flight) from each tree, the trees' order alternating from round to round; each side in a fresh spawned process
whose ``sys.path`` starts with its tree (checked). Prints per broker and tree the median msg/s [min–max] and the
median of the per-round ratios relay / client loop, then each tree / the first tree given.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
THIS_TREE = str(HERE.parents[1])
for entry in (str(HERE.parent), THIS_TREE):
    if entry not in sys.path:
        sys.path.insert(0, entry)

BROKERS = ("nats", "rabbitmq", "kafka")


def _in_tree(tree: str, func: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run ``func`` in a spawned process whose package comes from ``tree`` (the child inherits sys.path)."""
    from obench.common import run_processes

    sys.path.insert(0, tree)
    try:
        out = run_processes([(_tagged, (func, args))], 600)[0]
    finally:
        sys.path.remove(tree)
    if not str(out["package"]).startswith(tree):
        raise RuntimeError(f"the child imported {out['package']}, not the tree {tree}")
    return dict(out["result"])


def _tagged(func: Callable[..., dict[str, Any]], args: tuple[Any, ...], barrier: Callable[[], None]) -> dict[str, Any]:
    import outbox_pipelines

    return {"result": func(*args, barrier), "package": outbox_pipelines.__file__}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}–{max(values):,.0f}]"


class Nats:
    def __init__(self, db_url: str, messages: int) -> None:
        from obench import broker_nats as nb

        from outbox_pipelines_tests.brokers.nats_server import NatsServer

        self.nb, self.db_url, self.messages = nb, db_url, messages
        self.server = NatsServer().start()
        for side in (nb.RELAY, "publish-gather-32", "publish-async-32"):
            stream, prefix = nb._stream(side)
            self.server.add_stream(stream, [prefix + ">"])

    def loop(self, run: int) -> float:
        return max(self.nb._measure_loop(self.server, kind, self.messages, run, 0) for kind in self.nb.LOOPS[:2])

    def relay(self, tree: str, run: int) -> float:
        nb = self.nb
        nb._load(self.db_url, self.messages, f"paths-nats-{run}-{time.monotonic_ns()}")
        out = _in_tree(tree, nb.relay_drain, self.db_url, self.server.url, nb.BATCH)
        stored = nb._stored_then_purged(self.server, nb._stream(nb.RELAY)[0])
        counts = nb.count_by_status(self.db_url, nb.TABLE)
        if out["sent"] != self.messages or stored != self.messages or counts != {"sent": self.messages}:
            raise RuntimeError(f"nats relay: {out}, table {counts}, the stream holds {stored}")
        return float(out["rate"])

    def close(self) -> None:
        self.server.cleanup()


class Rabbit:
    def __init__(self, db_url: str, messages: int) -> None:
        from obench import broker_rabbitmq as rb

        from outbox_pipelines_tests.brokers.rabbitmq_server import RabbitMQ, bind_queue

        self.rb, self.db_url, self.messages = rb, db_url, messages
        self.node = RabbitMQ(prefix="outbox-bench-paths-").__enter__()
        for side in ("relay", "aiormq-32"):
            bind_queue(self.node.url, f"bench-{side}", f"bench-{side}", "#")
        self.rows = rb.make_rows(messages, rb.TOPIC, "rabbitmq")

    def loop(self, run: int) -> float:
        from obench.common import run_processes

        rb = self.rb
        out = run_processes([(rb.client_loop, ("aiormq-32", self.node.url, "bench-aiormq-32", self.messages))], 300)[0]
        stored = rb._queue_count(self.node.url, "bench-aiormq-32", purge=True)
        if out["confirmed"] != self.messages or stored != self.messages:
            raise RuntimeError(f"aiormq loop: {out}, the queue holds {stored}")
        return float(out["rate"])

    def relay(self, tree: str, run: int) -> float:
        import psycopg

        rb = self.rb
        rb.reset_table(self.db_url, rb.TABLE)
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            rb.copy_rows(conn, rb.TABLE, self.rows)
        rb.settle_server(self.db_url, rb.TABLE)
        out = _in_tree(tree, rb.relay_drain, self.db_url, self.node.url, "bench-relay")
        stored = rb._queue_count(self.node.url, "bench-relay", purge=True)
        counts = rb.count_by_status(self.db_url, rb.TABLE)
        if out["sent"] != self.messages or stored != self.messages or counts != {"sent": self.messages}:
            raise RuntimeError(f"rabbitmq relay: {out}, table {counts}, the queue holds {stored}")
        return float(out["rate"])

    def close(self) -> None:
        self.node.__exit__(None, None, None)


class Kafka:
    def __init__(self, db_url: str, messages: int) -> None:
        from obench import broker_kafka as kb

        from outbox_pipelines_tests.brokers.kafka_cluster import KafkaCluster

        self.kb, self.db_url, self.messages = kb, db_url, messages
        self.cluster = KafkaCluster(brokers=3).__enter__()
        self.rows = kb.make_rows(messages, kb.TOPIC, "kafka")
        self.topics = 0

    def loop(self, run: int) -> float:
        from obench.common import run_processes

        kb = self.kb
        self.topics += 1
        topic = f"paths-loop-{self.topics}.{kb.TOPIC}"
        self.cluster.create_topic(topic, kb.PARTITIONS)
        job = (kb.client_loop, (self.cluster.bootstrap, topic, self.messages, kb.BATCH))
        out = run_processes([job], 300)[0]
        if out["failed"] or out["delivered"] != self.messages:
            raise RuntimeError(f"kafka loop: {out}")
        return float(out["rate"])

    def relay(self, tree: str, run: int) -> float:
        import psycopg

        kb = self.kb
        self.topics += 1
        prefix = f"paths-relay-{self.topics}."
        self.cluster.create_topic(prefix + kb.TOPIC, kb.PARTITIONS)
        kb.reset_table(self.db_url, kb.TABLE)
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            kb.copy_rows(conn, kb.TABLE, self.rows)
        kb.settle_server(self.db_url, kb.TABLE)
        out = _in_tree(tree, kb.relay_drain, self.db_url, self.cluster.bootstrap, prefix, kb.BATCH)
        counts = kb.count_by_status(self.db_url, kb.TABLE)
        if out["sent"] != self.messages or counts != {"sent": self.messages}:
            raise RuntimeError(f"kafka relay: {out}, table {counts}")
        kb._check_topic(self.cluster.bootstrap, prefix + kb.TOPIC, self.messages, exactly_once=False)
        return float(out["rate"])

    def close(self) -> None:
        self.cluster.__exit__(None, None, None)


KINDS: dict[str, Callable[[str, int], Any]] = {"nats": Nats, "rabbitmq": Rabbit, "kafka": Kafka}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", help="package trees to compare with this one (the first: the baseline)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--only", choices=BROKERS, action="append", help="a broker (repeatable); all by default")
    args = parser.parse_args()
    import os

    from obench.common import BenchServer

    trees = {f"tree{n}": str(Path(t).resolve()) for n, t in enumerate(args.trees)}
    trees["this"] = THIS_TREE
    server = BenchServer()
    name, url = server.create_database("broker_paths")
    print(f"load average at start {os.getloadavg()[0]:.2f}; trees {trees}", flush=True)
    try:
        for kind in args.only or BROKERS:
            side = KINDS[kind](url, args.messages)
            rates: dict[str, list[float]] = {t: [] for t in trees}
            loops: list[float] = []
            try:
                for run in range(args.runs):
                    loops.append(side.loop(run))
                    order = list(trees) if run % 2 == 0 else list(reversed(list(trees)))
                    for tree in order:
                        rates[tree].append(side.relay(trees[tree], run))
                    shown = ", ".join(f"{t} {rates[t][-1]:,.0f}" for t in trees)
                    print(f"  {kind} round {run + 1}: loop {loops[-1]:,.0f}; relay {shown}", flush=True)
            finally:
                side.close()
            first = next(iter(trees))
            print(f"## {kind}: client loop {_spread(loops)} msg/s")
            for tree, values in rates.items():
                to_loop = statistics.median(v / c for v, c in zip(values, loops, strict=True))
                to_first = statistics.median(v / f for v, f in zip(values, rates[first], strict=True))
                print(f"- {tree}: relay {_spread(values)} msg/s; / loop {to_loop:.2f}×; / {first} {to_first:.2f}×")
    finally:
        print(f"load average at end {os.getloadavg()[0]:.2f}", flush=True)
        server.drop_database(name)
        server.close()


if __name__ == "__main__":
    main()
