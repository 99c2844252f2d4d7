"""What the first-enqueue schema check costs (issue 41): one message per transaction, before and after.

    .venv/bin/python bench/enqueue_check_cost.py BEFORE_TREE AFTER_TREE [runs] [transactions]

Each tree is a checkout of the package (``git worktree add /tmp/before <commit>``). One embedded server for both;
each tree migrates a database of its own and creates ``bench_events``. Then, ``runs`` times, each tree in turn
(two processes side by side, taking turns in blocks of 25 transactions, so that a slow patch hits both) enqueues
``transactions`` times, one message per transaction on one psycopg connection with its defaults; the first enqueue
of each process is timed apart (the check runs there). Twice: with synchronous_commit on (what an application
sees) and off (the client's and the server's work without the WAL flush, where an added cost shows most).
Prints each tree's median over the runs, in microseconds per transaction.

    .venv/bin/python bench/enqueue_check_cost.py --in-process [runs] [transactions]

measures the check alone in one process (``in_process``), where the noise of two processes does not reach.
"""

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()
BLOCK = 25  # transactions of one tree in a row; the trees take turns (obench/enqueue.py's reason)


def child(url: str, mode: str) -> None:
    """Migrate (``mode`` migrate), or enqueue a block of transactions each time the parent asks (a line with a
    count) and answer with the seconds it took; the first block's first enqueue is timed apart."""
    import psycopg

    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.models import Message

    if mode == "migrate":
        from outbox_pipelines.core.storage import migrate

        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT outbox_create_table('bench_events')")
        return
    outbox = Outbox("bench_events")
    tag = uuid.uuid4().hex[:8]
    sent = 0
    with psycopg.connect(url) as conn:
        if mode == "off":
            conn.execute("SET synchronous_commit = off")
            conn.commit()
        started = time.perf_counter()
        with conn.transaction():
            outbox.enqueue(conn, Message(topic="t", payload={"first": True}, event_id=f"{tag}-first"))
        print(json.dumps({"first_us": (time.perf_counter() - started) * 1e6}), flush=True)
        for line in sys.stdin:
            count = int(line)
            started = time.perf_counter()
            for n in range(sent, sent + count):
                with conn.transaction():
                    outbox.enqueue(
                        conn,
                        Message(topic="order.created", payload={"order": n, "lines": [1, 2, 3]}, event_id=f"{tag}-{n}"),
                    )
            sent += count
            print(json.dumps({"s": time.perf_counter() - started}), flush=True)


def start(tree: str, url: str, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": tree}
    return subprocess.Popen(
        [sys.executable, str(HERE), "--child", url, mode],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def one_run(trees: dict[str, str], urls: dict[str, str], mode: str, count: int) -> dict[str, tuple[float, float]]:
    """Both trees in one run, blocks of BLOCK transactions in turn: (us per transaction, first enqueue us)."""
    children = {name: start(tree, urls[name], mode) for name, tree in trees.items()}
    first = {name: json.loads(child.stdout.readline())["first_us"] for name, child in children.items()}  # type: ignore[union-attr]
    total = dict.fromkeys(trees, 0.0)
    order = list(trees)
    for block in range(count // BLOCK):
        for name in order if block % 2 == 0 else reversed(order):
            child = children[name]
            child.stdin.write(f"{BLOCK}\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            total[name] += json.loads(child.stdout.readline())["s"]  # type: ignore[union-attr]
    for child in children.values():
        child.stdin.close()  # type: ignore[union-attr]
        child.wait()
    return {name: (total[name] / (count // BLOCK * BLOCK) * 1e6, first[name]) for name in trees}


def main(before: str, after: str, runs: int, count: int) -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    from outbox_pipelines_tests.scratch import ScratchServer

    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-check-")
    try:
        import psycopg

        urls = {}
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            for name in ("before", "after"):
                admin.execute(f"DROP DATABASE IF EXISTS bench_check_{name}")
                admin.execute(f"CREATE DATABASE bench_check_{name}")
                urls[name] = psycopg.conninfo.make_conninfo(server.admin_url, dbname=f"bench_check_{name}")
        trees = {"before": before, "after": after}
        for name, tree in trees.items():
            subprocess.run(
                [sys.executable, str(HERE), "--child", urls[name], "migrate"],
                env={**os.environ, "PYTHONPATH": tree},
                check=True,
            )
        for mode in ("on", "off"):
            results = [one_run(trees, urls, mode, count) for _ in range(runs)]
            for name in trees:
                per_txn = [r[name][0] for r in results]
                first = [r[name][1] for r in results]
                print(
                    f"synchronous_commit={mode} {name}: median {statistics.median(per_txn):.1f} us/txn "
                    f"(runs: {', '.join(f'{v:.1f}' for v in per_txn)}); first enqueue median "
                    f"{statistics.median(first):.0f} us"
                )
            ratios = [r["after"][0] / r["before"][0] for r in results]
            print(
                f"synchronous_commit={mode} after/before: median {statistics.median(ratios):.3f} "
                f"(runs: {', '.join(f'{v:.3f}' for v in ratios)})"
            )
    finally:
        server.stop()


def in_process(runs: int, count: int) -> None:
    """The check's own cost, without the noise of two processes: one process, one connection, blocks of BLOCK
    transactions in turn with the check as shipped and with its lookup replaced by a constant (what an enqueue did
    before it), synchronous_commit off."""
    sys.path.insert(0, str(HERE.parents[1]))
    import psycopg

    from outbox_pipelines.core import enqueue as enqueue_module
    from outbox_pipelines.core.enqueue import Outbox
    from outbox_pipelines.core.enqueue_guard import Endpoint, sync_endpoint
    from outbox_pipelines.core.models import Message
    from outbox_pipelines.core.storage import migrate
    from outbox_pipelines_tests.scratch import ScratchServer

    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-check-")
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS bench_check_in_process")
            admin.execute("CREATE DATABASE bench_check_in_process")
        url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="bench_check_in_process")
        migrate.upgrade(url)
        outbox, direct = Outbox("bench_events"), Endpoint(pooled=False)
        variants = {"checked": sync_endpoint, "unchecked": lambda target: direct}
        with psycopg.connect(url) as conn:
            conn.execute("SELECT outbox_create_table('bench_events')")
            conn.execute("SET synchronous_commit = off")
            conn.commit()
            sent = 0
            for run_number in range(runs):
                total = dict.fromkeys(variants, 0.0)
                for block in range(count // BLOCK):
                    for name in variants if block % 2 == 0 else reversed(list(variants)):
                        enqueue_module.sync_endpoint = variants[name]  # type: ignore[assignment]
                        started = time.perf_counter()
                        for _ in range(BLOCK):
                            sent += 1
                            with conn.transaction():
                                outbox.enqueue(conn, Message(topic="t", payload={"n": sent}, event_id=f"e-{sent}"))
                        total[name] += time.perf_counter() - started
                per_txn = {name: t / (count // BLOCK * BLOCK) * 1e6 for name, t in total.items()}
                print(
                    f"run {run_number + 1}: checked {per_txn['checked']:.1f} us/txn, unchecked "
                    f"{per_txn['unchecked']:.1f}, ratio {per_txn['checked'] / per_txn['unchecked']:.4f}",
                    flush=True,
                )
        enqueue_module.sync_endpoint = sync_endpoint
    finally:
        server.stop()


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--in-process":
        in_process(int(sys.argv[2]) if len(sys.argv) > 2 else 5, int(sys.argv[3]) if len(sys.argv) > 3 else 2000)
    else:
        runs, count = (int(sys.argv[3]) if len(sys.argv) > 3 else 5), (int(sys.argv[4]) if len(sys.argv) > 4 else 2000)
        main(sys.argv[1], sys.argv[2], runs, count)
