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

With ``--drain``, the burst is drained instead, by the relay's own statements with the plans a relay keeps: a relay
session (relay/session.py) makes them on the emptied queue (one empty claim), then claims and settles the keyed
burst 100 at a time (held batches, or leased with ``--leased``), each batch's next messages of each key following;
the seconds of the drain, and the rows its claims read (pg_stat_user_tables, idx_tup_fetch).
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
EMPTY_AFTER_FULL = """
import psycopg
def empty_after_full(url, table, count, keys):
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            f"INSERT INTO {table} (event_id, topic, payload, payload_sha, headers, ordering_key) "
            "SELECT 'old-' || n, 't', '{}'::jsonb, 'sha', '{}'::jsonb, 'k-' || (n %% %s) "
            "FROM generate_series(1, %s) AS n ORDER BY n", (keys, count))
        admin.execute(f"ANALYZE {table}")
        admin.execute(f"DELETE FROM {table}")
        admin.execute(f"VACUUM {table}")
"""
BURST = (
    EMPTY_AFTER_FULL
    + """
import json, sys, time, psycopg
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
url, table, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
keys = max(count // 5, 1)
empty_after_full(url, table, count, keys)
messages = [Message(topic="t", payload={"n": i}, event_id=f"new-{i}", ordering_key=f"k-{i % keys}")
            for i in range(count)]
with psycopg.connect(url) as conn:
    started = time.perf_counter()
    Outbox(table).enqueue_many(conn, messages)
    scans = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = %s", (table,)).fetchone()[0]
    conn.commit()
    print(json.dumps({"seconds": time.perf_counter() - started, "seq_scans": scans}))
"""
)

DRAIN = (
    EMPTY_AFTER_FULL
    + """
import json, sys, time, psycopg
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.relay.session import open_session
from outbox_pipelines.core.storage.table import OutboxTable
url, table, count, leased = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "leased"
keys = max(count // 30, 1)
empty_after_full(url, table, count, keys)
def fetched(conn):
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute("SELECT idx_tup_fetch AS n FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()
    return row["n"]  # the relay's session returns rows as dicts
with psycopg.connect(url, autocommit=True) as admin:
    with open_session(url) as relay:
        outbox = OutboxTable(relay, table)
        def claim():
            if leased:
                return outbox.claim("bench", 100, 60, gated=True, reuse_plan=True)
            return outbox.claim_held(100, 60, gated=True, reuse_plan=True)
        with relay.transaction():
            claim()  # the plans the relay keeps, made on the emptied queue
        messages = [Message(topic="t", payload={"n": i}, event_id=f"new-{i}", ordering_key=f"k-{i % keys}")
                    for i in range(count)]
        Outbox(table).enqueue_many(admin, messages, outside_transaction=True)
        read_before, started, sent = fetched(relay), time.perf_counter(), 0
        while sent < count:
            with relay.transaction():
                batch = claim()
                if not batch:
                    raise RuntimeError(f"nothing to claim, {sent} of {count} sent")
                outbox.settle_sent("bench", [b.id for b in batch], [b.attempts for b in batch], audit_code="sent",
                                   held=not leased)
            sent += len(batch)
        seconds = time.perf_counter() - started
        print(json.dumps({"seconds": seconds, "rows_read": fetched(relay) - read_before}))
"""
)


def prepare(tree: str, admin_url: str, name: str) -> str:
    """A database of the tree's schema with the table (autovacuum off: the statistics stay as the run leaves them)."""
    return tree_database(
        tree,
        admin_url,
        name,
        [f"SELECT outbox_create_table('{TABLE}')", f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)"],
    )


def burst(tree: str, url: str, count: int, drain: str | None = None) -> dict[str, float]:
    """The burst into the emptied queue (``drain``: None), or its drain by held or leased batches."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
    command = ["-c", BURST, url, TABLE, str(count)] if drain is None else ["-c", DRAIN, url, TABLE, str(count), drain]
    done = subprocess.run(
        [sys.executable, *command],
        env=env_for(tree, {}),
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before_tree")
    parser.add_argument("after_tree", nargs="?", default=THIS_TREE)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--drain", action="store_true", help="drain the burst with a relay's kept plans instead")
    parser.add_argument("--leased", action="store_true", help="with --drain: leased batches (the brokers' claim)")
    args = parser.parse_args()
    drain = ("leased" if args.leased else "held") if args.drain else None
    detail, what = ("rows_read", "rows read by the drain") if drain else ("seq_scans", "sequential scans")
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
                results[name].append(burst(trees[name], urls[name], args.messages, drain))
            print(
                f"run {run + 1}: "
                + ", ".join(
                    f"{n} {results[n][-1]['seconds']:.2f} s ({results[n][-1][detail]:,} {what})" for n in order
                ),
                flush=True,
            )
        action = f"drained in {drain} batches of 100" if drain else "in one enqueue_many"
        print(f"\n{args.messages:,} keyed messages {action}, into an emptied queue, medians of {args.runs}:")
        for name, values in results.items():
            seconds = sorted(v["seconds"] for v in values)
            counted = statistics.median(v[detail] for v in values)
            spread = f"[{seconds[0]:.2f}–{seconds[-1]:.2f}]"
            print(f"  {name:6s} {statistics.median(seconds):.2f} s {spread}, {counted:,.0f} {what}")
        ratios = sorted(a["seconds"] / b["seconds"] for a, b in zip(results["after"], results["before"], strict=True))
        print(f"  after / before (time): {statistics.median(ratios):.3f} [{ratios[0]:.3f}–{ratios[-1]:.3f}]")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
