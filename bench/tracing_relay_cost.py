"""What the relay's send spans cost a drain: tracing off (no SDK) and on, the tree before them against after.

    git archive <commit before> outbox_pipelines sql | tar -x -C /tmp/trc-before
    git archive <commit after> outbox_pipelines sql | tar -x -C /tmp/trc-after     # or leave AFTER out: this tree
    .venv/bin/python bench/tracing_relay_cost.py /tmp/trc-before [/tmp/trc-after] [--runs 7] [--messages 5000]

One embedded server (or OUTBOX_TEST_DATABASE_URL's); each tree migrates a database of its own, one table per
variant. Four processes, each a relay (``Relay.run(once=True)``, competing mode, the paper broker: in process, so
that the relay's own work is all there is to measure) that drains a table filled with ``messages`` rows, every
one carrying a ``traceparent`` in its headers (as an enqueue inside a span stores it):

- ``before`` / ``off``: the tree before / after, no OpenTelemetry SDK: what tracing off costs a drain;
- ``before+sdk`` / ``on``: the same with an SDK TracerProvider installed (BatchSpanProcessor, an exporter that
  drops every span): before, a span per message; after, a span per destination call with a link per message.

Each run fills (untimed) and drains every variant once, in an order shuffled per run, so that a slow patch of the
machine hits them all. Prints each run, then medians over the runs (µs per message) and the medians of the
per-run ratios [lowest–highest].
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
THIS_TREE = str(HERE.parents[1])
VARIANTS = {"before": ("before", False), "off": ("after", False), "before+sdk": ("before", True), "on": ("after", True)}
FILL = (
    "INSERT INTO {table} (event_id, topic, payload, payload_sha, headers) "
    "SELECT %(tag)s || '-' || n, 'order.created', jsonb_build_object('order', n, 'lines', '[1,2,3]'::jsonb), "
    "'sha256:' || md5(n::text), jsonb_build_object('traceparent', "
    "'00-' || md5(%(tag)s || n) || '-' || substr(md5(n || %(tag)s), 1, 16) || '-01') "
    "FROM generate_series(1, %(count)s) n"
)


def child(url: str, table: str, traced: bool) -> None:
    """Fill and drain the table each time the parent asks (a line ``count``); answer with the drain's seconds."""
    import psycopg

    from outbox_pipelines.core.destinations.paper import PaperBroker
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    if traced:
        from obench.tracing_sdk import install_dropping_provider

        install_dropping_provider()
    settings = TableSettings(name=table, mode="competing", on_success="delete")
    fill = FILL.replace("{table}", table)  # the bench's own table name, not input
    rounds = 0
    with psycopg.connect(url, autocommit=True) as conn:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            count = int(line)
            rounds += 1
            conn.execute(fill, {"tag": f"r{rounds}", "count": count})
            conn.execute(f"VACUUM ANALYZE {table}")
            started, cpu = time.perf_counter(), time.process_time()
            report = Relay(url, settings, PaperBroker(), worker_id=f"bench-{table}").run(once=True)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            print(json.dumps({"s": seconds, "cpu": cpu, "sent": report.sent}), flush=True)


def start(tree: str, url: str, table: str, traced: bool) -> "subprocess.Popen[str]":
    from obench.child_process import start_child

    return start_child(HERE, tree, [url, table, "traced" if traced else "plain"], drop_env=("OTEL_", "OUTBOX_"))


def one_run(
    children: dict[str, "subprocess.Popen[str]"], count: int, rng: random.Random
) -> dict[str, dict[str, float]]:
    """µs per message of each variant's drain of ``count`` messages (wall ``s``, and ``cpu``: the relay process's
    CPU, all its threads, which other work on the machine disturbs less), the variants in a shuffled order."""
    figures = {}
    order = list(children)
    rng.shuffle(order)
    for name in order:
        process = children[name]
        process.stdin.write(f"{count}\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(process.stdout.readline())  # type: ignore[union-attr]
        if answer["sent"] != count:
            raise RuntimeError(f"{name}: sent {answer['sent']} of {count}")
        figures[name] = {key: answer[key] / count * 1e6 for key in ("s", "cpu")}
    return {name: figures[name] for name in children}


def gate_cost() -> float:
    """µs of the relay's gate per batch (``tracing.enabled()``) with no SDK, in this process."""
    from outbox_pipelines.core.telemetry import tracing

    calls = 200_000
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            tracing.enabled()
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before_tree")
    parser.add_argument("after_tree", nargs="?", default=THIS_TREE)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()
    sys.path.insert(0, THIS_TREE)
    import psycopg

    from outbox_pipelines_tests.scratch import ScratchServer

    trees = {"before": os.path.abspath(args.before_tree), "after": os.path.abspath(args.after_tree)}
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-relay-tracing-")
    children: dict[str, subprocess.Popen[str]] = {}
    try:
        urls = {}
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            for name in trees:
                admin.execute(f"DROP DATABASE IF EXISTS bench_relay_tracing_{name}")
                admin.execute(f"CREATE DATABASE bench_relay_tracing_{name}")
                urls[name] = psycopg.conninfo.make_conninfo(server.admin_url, dbname=f"bench_relay_tracing_{name}")
        for name, tree in trees.items():
            tables = [f"bench_{v.replace('+', '_')}" for v, (t, _) in VARIANTS.items() if t == name]
            script = (
                "import sys, psycopg\nfrom outbox_pipelines.core.storage import migrate\nmigrate.upgrade(sys.argv[1])\n"
                "with psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
                "    for t in sys.argv[2:]: c.execute('SELECT outbox_create_table(%s)', (t,))\n"
            )
            subprocess.run(
                [sys.executable, "-c", script, urls[name], *tables],
                env={**os.environ, "PYTHONPATH": tree},
                check=True,
                cwd="/",
            )
        for variant, (tree, traced) in VARIANTS.items():
            children[variant] = start(trees[tree], urls[tree], f"bench_{variant.replace('+', '_')}", traced)
        rng = random.Random(46)
        one_run(children, 500, rng)  # warm-up: plans, caches, the first batch's imports
        runs = []
        for run in range(args.runs):
            figures = one_run(children, args.messages, rng)
            runs.append(figures)
            print(
                f"run {run + 1}: " + ", ".join(f"{k} {v['s']:.2f} us ({v['cpu']:.2f} CPU)" for k, v in figures.items()),
                flush=True,
            )
        print(f"\nrelay gate alone (tracing.enabled(), no SDK): {gate_cost():.2f} us per batch\n")
        print(f"µs per message drained ({args.messages} a drain, paper broker), medians of {args.runs} runs:\n")
        print("| time | before | off | off / before | before + SDK | on | on / before + SDK | on / off |")
        print("|---|---|---|---|---|---|---|---|")
        for key, label in (("s", "wall"), ("cpu", "relay CPU")):
            m = {v: statistics.median(r[v][key] for r in runs) for v in VARIANTS}

            def cell(a: str, b: str) -> str:
                values = sorted(r[a][key] / r[b][key] for r in runs)  # noqa: B023 (used at once)
                return f"{statistics.median(values):.3f} [{values[0]:.3f}–{values[-1]:.3f}]"

            print(
                f"| {label} | {m['before']:.2f} | {m['off']:.2f} | {cell('off', 'before')} | {m['before+sdk']:.2f} "
                f"| {m['on']:.2f} | {cell('on', 'before+sdk')} | {cell('on', 'off')} |"
            )
    finally:
        for process in children.values():
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=30)
        server.stop()


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4] == "traced")
    else:
        main()
