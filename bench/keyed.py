"""Per-key order at speed (issue 47): two trees in turns, the keyed figures against the unkeyed ones.

    .venv/bin/python bench/keyed.py BEFORE_TREE [AFTER_TREE] [--runs 5] [--messages 50000] [--only drain|latency]

Each tree is a copy of the package and its sql/ (``git archive HEAD outbox_pipelines sql | tar -x -C /tmp/before``;
AFTER_TREE defaults to this checkout). One embedded server, a database per tree. Each run, the trees take turns
(the first alternates) at each figure of obench/ordering.py, in a rotating order:

- drains, 4 relays at default settings (competing, no-op destination): the messages without keys; the same over
  10,000 keys; the keyed load beside 100 hot keys each blocked by a dead head with 1,000 waiting (the other keys'
  rate counted);
- commit -> handler at a steady 500 msg/s (obench/latency.py's Relay on outbox_events), over 100 keys and without;
- a trickle's relay cycle, one process, no relay loop: enqueue one message and commit, then claim it held and settle
  it (the default claim = "auto"), keyed (100 keys) and not in shuffled blocks of 25: the ms of each step.

Prints each figure's median [min-max] per tree, the per-run ratios keyed/unkeyed, blocked/keyed, and after/before.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
DRAINS = ("unkeyed", "keyed", "keyed beside 100 blocked keys")
CYCLE_STEPS = ("enqueue", "claim", "settle")


def cycle(url: str, blocks: int = 40) -> dict[str, float]:
    """The ms of each step of a one-message relay cycle, keyed and not (medians; see the module's docstring)."""
    import random
    import time

    import psycopg
    from obench.common import reset_table, sample_payload
    from obench.latency import TABLE, TOPIC
    from psycopg.rows import dict_row

    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message
    from outbox_pipelines.core.storage.table import OutboxTable

    reset_table(url, TABLE)
    outbox = Outbox(TABLE)
    times: dict[str, list[float]] = {f"{kind} {step}": [] for kind in ("keyed", "unkeyed") for step in CYCLE_STEPS}
    with psycopg.connect(url) as producer, psycopg.connect(url, autocommit=True, row_factory=dict_row) as relay:
        table = OutboxTable(relay, TABLE)
        n = 0
        for block in range(blocks):
            for kind in random.sample(("keyed", "unkeyed"), 2):
                for _ in range(25):
                    n += 1
                    key = f"agg-{n % 100}" if kind == "keyed" else None
                    started = time.perf_counter()
                    outbox.enqueue(
                        producer, Message(topic=TOPIC, payload=sample_payload(n), event_id=f"c-{n}", ordering_key=key)
                    )
                    producer.commit()
                    committed = time.perf_counter()
                    with relay.transaction():
                        batch = table.claim_held(100, 30.0, reuse_plan=True)
                        claimed = time.perf_counter()
                        table.settle_sent(
                            "w", [m.id for m in batch], [m.attempts for m in batch], audit_code="outbox_sent", held=True
                        )
                    settled = time.perf_counter()
                    if len(batch) != 1:
                        raise RuntimeError(f"cycle: claimed {len(batch)}")
                    if block >= 2:  # warm-up left out
                        for step, ms in zip(
                            CYCLE_STEPS, (committed - started, claimed - committed, settled - claimed), strict=True
                        ):
                            times[f"{kind} {step}"].append(ms * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


LATENCIES = (("unkeyed", 0), ("keyed", 100))


def child(url: str, mode: str, arg: str, messages: int) -> None:
    """Migrate, or measure one figure and print it as JSON."""
    import outbox_pipelines

    if mode == "migrate":
        from outbox_pipelines.core.storage import migrate

        migrate.upgrade(url, parts=("orders", "examples"))  # outbox_orders, as the bench's template has it
        print(json.dumps({"package": outbox_pipelines.__file__}), flush=True)
        return
    from obench import ordering
    from obench.common import Sizes

    if mode == "drain":
        found: dict[str, object] = {"rate": ordering.drain(url, arg, messages)}
    elif mode == "cycle":
        found = dict(cycle(url))
    else:
        found = dict(ordering.latency(url, Sizes(), int(arg)))
    print(json.dumps({**found, "package": outbox_pipelines.__file__}), flush=True)


def _run_child(tree: str, url: str, mode: str, arg: str, messages: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE.parent}"}
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", url, mode, arg, str(messages)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree} {mode} {arg}: {out.stderr[-3000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert str(found.pop("package")).startswith(tree), (tree, found)
    return found


def _spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def _ratio(top: list[float], bottom: list[float]) -> str:
    ratios = [a / b for a, b in zip(top, bottom, strict=True)]
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def _report(found: dict[str, dict[str, list[dict[str, float]]]], name: str, tree: str, only: str | None) -> None:
    """One tree's figures: medians [min-max] over the runs, and the per-run ratios' median [min-max]."""
    print(f"== {name} ({tree})")
    if only in (None, "drain"):
        rate = {load: [v["rate"] for v in found[load][name]] for load in DRAINS}
        for load in DRAINS:
            print(f"  drain {load:32s} {_spread(rate[load])} msg/s")
        print(f"  keyed / unkeyed: {_ratio(rate['keyed'], rate['unkeyed'])}")
        print(f"  beside 100 blocked keys / keyed: {_ratio(rate[DRAINS[2]], rate['keyed'])}")
    pairs: list[tuple[str, str, str]] = []
    if only in (None, "cycle"):
        pairs += [(f"cycle {step}", "cycle", step) for step in CYCLE_STEPS]
    if only in (None, "latency"):
        pairs += [(f"latency {q}", "latency", q) for q in ("p50", "p99")]
    for title, kind, field in pairs:
        if kind == "cycle":
            keyed = [v[f"keyed {field}"] for v in found["cycle"][name]]
            plain = [v[f"unkeyed {field}"] for v in found["cycle"][name]]
        else:
            keyed = [v[field] for v in found["latency keyed"][name]]
            plain = [v[field] for v in found["latency unkeyed"][name]]
        print(
            f"  {title}: keyed {_spread(keyed, 2)} ms, unkeyed {_spread(plain, 2)} ms; "
            f"keyed / unkeyed {_ratio(keyed, plain)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", default=str(HERE.parents[1]))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--only", choices=("drain", "latency", "cycle"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parents[1]))
    import psycopg

    from outbox_pipelines_tests.scratch import ScratchServer

    trees = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-keyed-")
    try:
        urls = {}
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            for name in trees:
                admin.execute(f"DROP DATABASE IF EXISTS bench_keyed_{name}")
                admin.execute(f"CREATE DATABASE bench_keyed_{name}")
                urls[name] = psycopg.conninfo.make_conninfo(server.admin_url, dbname=f"bench_keyed_{name}")
        for name, tree in trees.items():
            _run_child(tree, urls[name], "migrate", "", args.messages)
        figures: list[tuple[str, str, str]] = []
        if args.only in (None, "drain"):
            figures += [("drain", load, load) for load in DRAINS]
        if args.only in (None, "latency"):
            figures += [("latency", str(keys), f"latency {label}") for label, keys in LATENCIES]
        if args.only in (None, "cycle"):
            figures.append(("cycle", "", "cycle"))
        found: dict[str, dict[str, list[dict[str, float]]]] = {f[2]: {n: [] for n in trees} for f in figures}
        for run in range(args.runs):
            shift = run % len(figures)
            for index, (mode, arg, label) in enumerate(figures[shift:] + figures[:shift]):
                order = list(trees) if (run + index) % 2 == 0 else list(reversed(list(trees)))
                for name in order:
                    value = _run_child(trees[name], urls[name], mode, arg, args.messages)
                    found[label][name].append(value)
                    if mode == "drain":
                        shown = f"{value['rate']:9,.0f} msg/s"
                    elif mode == "latency":
                        shown = f"p50 {value['p50']:6.2f} ms  p99 {value['p99']:6.2f} ms"
                    else:
                        shown = "  ".join(f"{step} {ms:.2f}" for step, ms in value.items())
                    print(f"run {run + 1}/{args.runs} {label:32s} {name:6s} {shown}", flush=True)
        print(f"load average at end: {os.getloadavg()}", flush=True)
        for name in trees:
            _report(found, name, trees[name], args.only)
        for label, by_tree in found.items():
            key = "rate" if label in DRAINS else "p99" if label.startswith("latency") else "keyed settle"
            print(
                f"after/before {label} ({key}): "
                f"{_ratio([v[key] for v in by_tree['after']], [v[key] for v in by_tree['before']])}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
