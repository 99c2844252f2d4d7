"""The drain before and after a change to the claim and settle statements (issue 44: one source for the claim modes).

    .venv/bin/python bench/claim_paths.py BEFORE_TREE AFTER_TREE [runs] [messages] [drains, e.g. 0 or 0,1]

Each tree is a copy of the package (``git archive <commit> | tar -x -C /tmp/before``). One embedded server; each
tree migrates a database of its own. Then, ``runs`` times, the trees take turns (the first one alternates) at each
drain of obench/drain.py: at default settings (every TableSettings default but competing mode, 4 processes: the
scenario's "drain at default settings"), and at batch 1,000 in 1 process under each claim mode. Prints each
figure's median over the runs per tree and the median of the per-run after/before ratios.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
# (label, processes, TableSettings overrides)
DRAINS: tuple[tuple[str, int, dict[str, object]], ...] = (
    ("defaults, 4 processes", 4, {}),
    ("claim=auto, batch 1,000, 1 process", 1, {"claim": "auto", "batch_size": 1000}),
    ("claim=lease, batch 1,000, 1 process", 1, {"claim": "lease", "batch_size": 1000}),
    ("claim=transaction, batch 1,000, 1 process", 1, {"claim": "transaction", "batch_size": 1000}),
)


def child(url: str, mode: str, messages: int) -> None:
    """Migrate (``migrate``), or run the drain numbered ``mode`` once and print its msg/s."""
    if mode == "migrate":
        from outbox_pipelines.core.storage import migrate

        migrate.upgrade(url, parts=("orders", "examples"))  # outbox_orders, as the bench's template has it
        return
    from obench.common import make_rows
    from obench.drain import TABLE, drain_once

    import outbox_pipelines

    label, workers, overrides = DRAINS[int(mode)]
    rows = make_rows(messages, "order.created", "drain")
    rate = drain_once(url, "ours", workers, rows, dict(overrides))
    print(json.dumps({"rate": rate, "package": outbox_pipelines.__file__, "table": TABLE}), flush=True)


def _run_child(tree: str, url: str, mode: str, messages: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE.parent}"}
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", url, mode, str(messages)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree} {mode}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main(before: str, after: str, runs: int, messages: int, only: list[int]) -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    import psycopg

    from outbox_pipelines_tests.scratch import ScratchServer

    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-claim-")
    try:
        urls = {}
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            for name in ("before", "after"):
                admin.execute(f"DROP DATABASE IF EXISTS bench_claim_{name}")
                admin.execute(f"CREATE DATABASE bench_claim_{name}")
                urls[name] = psycopg.conninfo.make_conninfo(server.admin_url, dbname=f"bench_claim_{name}")
        trees = {"before": before, "after": after}
        for name, tree in trees.items():
            _run_child(tree, urls[name], "migrate", messages)
        chosen = [(index, DRAINS[index][0]) for index in only]
        rates: dict[str, dict[str, list[float]]] = {label: {"before": [], "after": []} for _, label in chosen}
        for run in range(runs):
            for index, label in chosen:
                order = list(trees) if (run + index) % 2 == 0 else list(reversed(list(trees)))
                for name in order:
                    found = _run_child(trees[name], urls[name], str(index), messages)
                    assert str(found["package"]).startswith(trees[name]), found
                    rates[label][name].append(float(str(found["rate"])))
                    print(
                        f"run {run + 1}/{runs} {label:42s} {name:6s} {rates[label][name][-1]:9,.0f} msg/s", flush=True
                    )
        for label, by_tree in rates.items():
            ratios = [a / b for a, b in zip(by_tree["after"], by_tree["before"], strict=True)]
            before_s, after_s = (_spread(by_tree[name]) for name in ("before", "after"))
            print(
                f"{label}: before {before_s}, after {after_s} msg/s; after/before median "
                f"{statistics.median(ratios):.3f} (runs: {', '.join(f'{r:.3f}' for r in ratios)})",
                flush=True,
            )
    finally:
        server.stop()


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main(
            str(Path(sys.argv[1]).resolve()),
            str(Path(sys.argv[2]).resolve()),
            int(sys.argv[3]) if len(sys.argv) > 3 else 3,
            int(sys.argv[4]) if len(sys.argv) > 4 else 100_000,
            [int(n) for n in sys.argv[5].split(",")] if len(sys.argv) > 5 else list(range(len(DRAINS))),
        )
