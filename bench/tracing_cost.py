"""What the creation context costs an enqueue: tracing off (no SDK) against the tree before it, and on.

    git archive <commit before> outbox_pipelines sql | tar -x -C /tmp/tc-before
    .venv/bin/python bench/tracing_cost.py /tmp/tc-before [--runs 7] [--transactions 2000] [--batches 200]
    .venv/bin/python bench/tracing_cost.py --in-process RUNS TRANSACTIONS BATCHES   # this tree alone (in_process)

One embedded server (or OUTBOX_TEST_DATABASE_URL's); each tree migrates a database of its own, one table per
variant. Five processes, each on one psycopg connection with synchronous_commit off (the client's and the
server's work without the WAL flush, where an added cost shows most):

- ``before``: the tree before (BEFORE_TREE), no OpenTelemetry SDK, no span: what an enqueue cost;
- ``off``: this tree, the same: the gate alone (one context variable read);
- ``before+span``: the tree before, an SDK TracerProvider (BatchSpanProcessor, an exporter that drops every
  span) installed, each transaction inside a request span: an application that traces, before;
- ``on``: this tree, the same: the create span per message and its context in the headers;
- ``create-off``: ``on`` with OUTBOX_TRACE_CREATE=off: the request span's context stored, no create span.

Two operations: ``one`` (one ``enqueue`` per transaction) and ``many`` (one ``enqueue_many`` of 100 messages per
transaction: the COPY path). Each run does ``transactions`` (``batches``) of each variant in blocks of 25 (5),
the variants' order shuffled per block, so that a slow patch of the machine hits them all. Prints each run,
then a table of medians over the runs (µs per transaction), medians of the per-run ratios [lowest–highest], and
what the create spans add per message (``on`` − ``before+span``).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()
AFTER_TREE = str(HERE.parents[1])
# variant: (tree, SDK and a request span, OUTBOX_TRACE_CREATE)
VARIANTS = {
    "before": ("before", False, "on"),
    "off": ("after", False, "on"),
    "before+span": ("before", True, "on"),
    "on": ("after", True, "on"),
    "create-off": ("after", True, "off"),
}
BLOCKS = {"one": 25, "many": 5}
BATCH = 100


def child(url: str, table: str, traced: bool) -> None:
    """Enqueue a block each time the parent asks (a line ``op count``), answer with the seconds it took."""
    import psycopg

    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message

    request = None
    if traced:
        from obench.tracing_sdk import install_dropping_provider
        from opentelemetry import trace

        install_dropping_provider()
        request = trace.get_tracer("bench.app")
    outbox = Outbox(table)
    tag = uuid.uuid4().hex[:8]
    sent = 0
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.commit()
        with conn.transaction():  # the first enqueue's schema check, untimed
            outbox.enqueue(conn, Message(topic="t", payload={"first": True}, event_id=f"{tag}-first"))
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            op, count = line.split()
            started = time.perf_counter()
            for _ in range(int(count)):
                if request is not None:
                    with request.start_as_current_span("POST /orders"):
                        sent = _transaction(conn, outbox, op, tag, sent)
                else:
                    sent = _transaction(conn, outbox, op, tag, sent)
            print(json.dumps({"s": time.perf_counter() - started}), flush=True)


def _transaction(conn: object, outbox: object, op: str, tag: str, sent: int) -> int:
    from outbox_pipelines.core.models import Message

    with conn.transaction():  # type: ignore[attr-defined]
        if op == "one":
            outbox.enqueue(  # type: ignore[attr-defined]
                conn,
                Message(topic="order.created", payload={"order": sent, "lines": [1, 2, 3]}, event_id=f"{tag}-{sent}"),
            )
            return sent + 1
        batch = [
            Message(topic="order.created", payload={"order": n, "lines": [1, 2, 3]}, event_id=f"{tag}-{n}")
            for n in range(sent, sent + BATCH)
        ]
        outbox.enqueue_many(conn, batch)  # type: ignore[attr-defined]
        return sent + BATCH


def start(tree: str, url: str, table: str, traced: bool, create: str) -> subprocess.Popen[str]:
    from obench.child_process import start_child

    args = [url, table, "traced" if traced else "plain"]
    return start_child(HERE, tree, args, drop_env=("OTEL_",), env={"OUTBOX_TRACE_CREATE": create})


def one_run(children: dict[str, subprocess.Popen[str]], op: str, count: int, rng: random.Random) -> dict[str, float]:
    """µs per transaction of each variant: ``count`` transactions each, in shuffled blocks."""
    block = BLOCKS[op]
    spent = dict.fromkeys(children, 0.0)
    for _ in range(count // block):
        order = list(children)
        rng.shuffle(order)
        for name in order:
            process = children[name]
            process.stdin.write(f"{op} {block}\n")  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
            spent[name] += json.loads(process.stdout.readline())["s"]  # type: ignore[union-attr]
    done = count // block * block
    return {name: seconds / done * 1e6 for name, seconds in spent.items()}


def _table(variant: str) -> str:
    return "bench_" + variant.replace("+", "_").replace("-", "_")


def gate_cost() -> float:
    """µs of the gate alone (``creation`` with no span current), in this process, no SDK installed."""
    from outbox_pipelines.core.telemetry.creation import creation, producer

    made = producer("bench_gate")
    calls = 200_000
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            creation(made)
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before_tree")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, AFTER_TREE)
    import psycopg

    from outbox_pipelines_tests.scratch import ScratchServer

    trees = {"before": os.path.abspath(args.before_tree), "after": AFTER_TREE}
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-tracing-")
    children: dict[str, subprocess.Popen[str]] = {}
    try:
        urls = {}
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            for name in trees:
                admin.execute(f"DROP DATABASE IF EXISTS bench_tracing_{name}")
                admin.execute(f"CREATE DATABASE bench_tracing_{name}")
                urls[name] = psycopg.conninfo.make_conninfo(server.admin_url, dbname=f"bench_tracing_{name}")
        for name, tree in trees.items():
            tables = [_table(v) for v, (t, _, _) in VARIANTS.items() if t == name]
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
        for variant, (tree, traced, create) in VARIANTS.items():
            children[variant] = start(trees[tree], urls[tree], _table(variant), traced, create)
        rng = random.Random(46)
        medians: dict[str, dict[str, float]] = {}
        ratios: dict[str, dict[str, list[float]]] = {}
        for op, count in (("one", args.transactions), ("many", args.batches)):
            runs = []
            for run in range(args.runs):
                figures = one_run(children, op, count, rng)
                runs.append(figures)
                print(f"{op} run {run + 1}: " + ", ".join(f"{k} {v:.1f} us" for k, v in figures.items()), flush=True)
            medians[op] = {v: statistics.median(r[v] for r in runs) for v in VARIANTS}
            ratios[op] = {
                "off/before": sorted(r["off"] / r["before"] for r in runs),
                "on/before+span": sorted(r["on"] / r["before+span"] for r in runs),
                "create-off/before+span": sorted(r["create-off"] / r["before+span"] for r in runs),
            }
        print(f"\ngate alone (no span current, no SDK): {gate_cost():.2f} us per call\n")
        print(f"µs per transaction, medians of {args.runs} runs (synchronous_commit off):\n")
        print(
            "| operation | before | off | off / before | before + span | on | on / before + span "
            "| added per message | create off | create off / before + span |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for op in medians:
            m, r = medians[op], ratios[op]
            per_message = (m["on"] - m["before+span"]) / (1 if op == "one" else BATCH)

            def cell(values: list[float]) -> str:
                return f"{statistics.median(values):.3f} [{values[0]:.3f}–{values[-1]:.3f}]"

            label = "enqueue (1 per transaction)" if op == "one" else f"enqueue_many ({BATCH} per transaction)"
            print(
                f"| {label} | {m['before']:.0f} | {m['off']:.0f} | {cell(r['off/before'])} | {m['before+span']:.0f} "
                f"| {m['on']:.0f} | {cell(r['on/before+span'])} | {per_message:.1f} µs | {m['create-off']:.0f} "
                f"| {cell(r['create-off/before+span'])} |"
            )
    finally:
        for process in children.values():
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=30)
        server.stop()


def in_process(runs: int, count: int, batches: int) -> None:
    """This tree alone, one process, one connection (no noise of several processes): an SDK installed, the
    variants in shuffled blocks: no span current (the gate), a request span with OUTBOX_TRACE_CREATE off (its
    context stored), and on (a create span per message). Prints µs per transaction, medians over the runs."""
    sys.path.insert(0, AFTER_TREE)
    import psycopg
    from obench.tracing_sdk import install_dropping_provider

    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.storage import migrate
    from outbox_pipelines_tests.scratch import ScratchServer

    provider = install_dropping_provider(install=False)
    request = provider.get_tracer("bench.app")
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-tracing-")
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS bench_tracing_in_process")
            admin.execute("CREATE DATABASE bench_tracing_in_process")
        url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="bench_tracing_in_process")
        migrate.upgrade(url)
        os.environ["OUTBOX_TRACE_CREATE"] = "off"
        outboxes = {"no span": Outbox("bench_gate", tracer_provider=provider)}
        outboxes["span, create off"] = Outbox("bench_create_off", tracer_provider=provider)
        os.environ["OUTBOX_TRACE_CREATE"] = "on"
        outboxes["span, create on"] = Outbox("bench_create_on", tracer_provider=provider)
        rng, tag, sent = random.Random(46), uuid.uuid4().hex[:8], 0
        with psycopg.connect(url) as conn:
            for outbox in outboxes.values():
                conn.execute("SELECT outbox_create_table(%s)", (outbox.table_name,))
            conn.execute("SET synchronous_commit = off")
            conn.commit()
            for op, total in (("one", count), ("many", batches)):
                per_run = []
                for _ in range(runs):
                    spent = dict.fromkeys(outboxes, 0.0)
                    for _ in range(total // BLOCKS[op]):
                        order = list(outboxes)
                        rng.shuffle(order)
                        for name in order:
                            started = time.perf_counter()
                            for _ in range(BLOCKS[op]):
                                if name == "no span":
                                    sent = _transaction(conn, outboxes[name], op, tag, sent)
                                else:
                                    with request.start_as_current_span("POST /orders"):
                                        sent = _transaction(conn, outboxes[name], op, tag, sent)
                            spent[name] += time.perf_counter() - started
                    done = total // BLOCKS[op] * BLOCKS[op]
                    per_run.append({name: seconds / done * 1e6 for name, seconds in spent.items()})
                medians = {name: statistics.median(r[name] for r in per_run) for name in outboxes}
                added = statistics.median(r["span, create on"] - r["span, create off"] for r in per_run)
                print(
                    f"{op}: "
                    + ", ".join(f"{name} {us:.0f} us" for name, us in medians.items())
                    + f"; the create spans add {added / (1 if op == 'one' else BATCH):.1f} us per message",
                    flush=True,
                )
    finally:
        provider.shutdown()
        server.stop()


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4] == "traced")
    elif sys.argv[1] == "--in-process":
        in_process(*(int(arg) for arg in sys.argv[2:5]))
    else:
        main()
