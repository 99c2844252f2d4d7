"""A burst of keyed messages into a queue that was full and is empty again: two trees in turns.

    git archive HEAD outbox_pipelines sql | tar -x -C /tmp/before      # the tree before a change
    .venv/bin/python bench/emptied_queue.py /tmp/before [AFTER_TREE] [--runs 3] [--messages 20000]

What a queue goes through every day: a backlog builds, autovacuum analyzes the table full, the relays drain it, the
cleaner deletes the sent rows and VACUUM truncates the file. The statistics still describe the table full; its size
says empty. Then a burst comes. Per run, each tree (its own database, migrated by the tree, an outbox table with
autovacuum off so the statistics stay as they were) is loaded with ``messages`` keyed rows (``messages / 5`` keys),
analyzed, emptied (DELETE, VACUUM), then takes ``messages`` keyed messages in one ``Outbox.enqueue_many`` call, in a
process of its own running that tree's code: the seconds of the call and its commit, and the table's sequential
scans in that transaction (pg_stat_xact_user_tables). Prints each run and the medians, and after / before.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

from small_backlogs import env_for, tree_database

HERE = Path(__file__).resolve()
THIS_TREE = str(HERE.parents[1])
TABLE = "bench_emptied"
BURST = """
import json, sys, time, psycopg
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
url, table, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
keys = max(count // 5, 1)
with psycopg.connect(url, autocommit=True) as admin:
    admin.execute(
        f"INSERT INTO {table} (event_id, topic, payload, payload_sha, headers, ordering_key) "
        "SELECT 'old-' || n, 't', '{}'::jsonb, 'sha', '{}'::jsonb, 'k-' || (n %% %s) "
        "FROM generate_series(1, %s) AS n ORDER BY n", (keys, count))
    admin.execute(f"ANALYZE {table}")
    admin.execute(f"DELETE FROM {table}")
    admin.execute(f"VACUUM {table}")
messages = [Message(topic="t", payload={"n": i}, event_id=f"new-{i}", ordering_key=f"k-{i % keys}")
            for i in range(count)]
with psycopg.connect(url) as conn:
    started = time.perf_counter()
    Outbox(table).enqueue_many(conn, messages)
    scans = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = %s", (table,)).fetchone()[0]
    conn.commit()
    print(json.dumps({"seconds": time.perf_counter() - started, "seq_scans": scans}))
"""


def prepare(tree: str, admin_url: str, name: str) -> str:
    """A database of the tree's schema with the table (autovacuum off: the statistics stay as the run leaves them)."""
    return tree_database(
        tree,
        admin_url,
        name,
        [f"SELECT outbox_create_table('{TABLE}')", f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)"],
    )


def burst(tree: str, url: str, count: int) -> dict[str, float]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
    done = subprocess.run(
        [sys.executable, "-c", BURST, url, TABLE, str(count)],
        env=env_for(tree, {}),
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before_tree")
    parser.add_argument("after_tree", nargs="?", default=THIS_TREE)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args()
    sys.path.insert(0, THIS_TREE)
    from outbox_pipelines_tests.scratch import ScratchServer

    trees = {"before": os.path.abspath(args.before_tree), "after": os.path.abspath(args.after_tree)}
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-emptied-")
    rng = random.Random(24)
    try:
        urls = {name: prepare(tree, server.admin_url, f"bench_emptied_{name}") for name, tree in trees.items()}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for run in range(args.runs):
            order = list(trees)
            rng.shuffle(order)
            for name in order:
                results[name].append(burst(trees[name], urls[name], args.messages))
            print(
                f"run {run + 1}: "
                + ", ".join(
                    f"{n} {results[n][-1]['seconds']:.2f} s ({results[n][-1]['seq_scans']} scans)" for n in order
                ),
                flush=True,
            )
        print(f"\n{args.messages:,} keyed messages in one enqueue_many into an emptied queue, medians of {args.runs}:")
        for name, values in results.items():
            seconds = sorted(v["seconds"] for v in values)
            scans = statistics.median(v["seq_scans"] for v in values)
            spread = f"[{seconds[0]:.2f}–{seconds[-1]:.2f}]"
            print(f"  {name:6s} {statistics.median(seconds):.2f} s {spread}, {scans:.0f} sequential scans")
        ratios = sorted(a["seconds"] / b["seconds"] for a, b in zip(results["after"], results["before"], strict=True))
        print(f"  after / before (time): {statistics.median(ratios):.3f} [{ratios[0]:.3f}–{ratios[-1]:.3f}]")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
