"""What ``Inbox.receive`` adds to a consumer's transaction: a one-row consumer transaction with and without it.

    .venv/bin/python bench/inbox_cost.py [--runs 7] [--transactions 2000]

One embedded server (or OUTBOX_TEST_DATABASE_URL's), one migrated database with an inbox (``bench_inbox``) and the
consumer's own table (``bench_effects``: one row per message, a text key and a small payload). On ONE psycopg
connection with its defaults, each run does ``transactions`` consumer transactions of each kind, interleaved in
blocks of 25 (so that a slow patch of the machine hits both):

- ``plain``: ``with conn.transaction(): INSERT INTO bench_effects ...`` (the consumer's own INSERT alone);
- ``inbox``: the same, after ``Inbox("bench_inbox").receive(conn, message_id, consumer="bench")`` returned True;
- ``second``: the consumer's INSERT and a second one-row INSERT (``bench_more``), for scale: what any one more
  statement costs such a transaction.

Twice: synchronous_commit on (what a consumer sees: the commit waits for the WAL flush) and off (the client's and
the server's work without the flush, where an added statement shows most). Prints each run, then the medians over
the runs in microseconds per transaction and what the inbox adds (target: at most 30 %).
"""

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()
BLOCK = 25
TARGET = 0.30


def _setup(url: str) -> None:
    import psycopg

    from outbox_pipelines.core.inbox.schema import create_inbox
    from outbox_pipelines.core.storage import migrate

    migrate.upgrade(url)
    create_inbox(url, "bench_inbox")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_effects (message_id text PRIMARY KEY, amount int NOT NULL, note text)")
        conn.execute("CREATE TABLE bench_more (message_id text PRIMARY KEY, amount int NOT NULL, note text)")


def one_run(url: str, count: int, synchronous_commit: str) -> dict[str, float]:
    """``count`` transactions of each kind, in blocks of BLOCK in turn; microseconds per transaction of each."""
    import psycopg

    from outbox_pipelines import Inbox

    inbox = Inbox("bench_inbox")
    tag = uuid.uuid4().hex[:8]
    spent = {"plain": 0.0, "inbox": 0.0, "second": 0.0}
    with psycopg.connect(url) as conn:
        conn.execute(f"SET synchronous_commit = {'on' if synchronous_commit == 'on' else 'off'}")
        conn.commit()
        effect = "INSERT INTO bench_effects (message_id, amount, note) VALUES (%s, %s, %s)"

        def plain(message_id: str, n: int) -> None:
            with conn.transaction():
                conn.execute(effect, (message_id, n, "invoice"))

        def with_inbox(message_id: str, n: int) -> None:
            with conn.transaction():
                if inbox.receive(conn, message_id, consumer="bench"):
                    conn.execute(effect, (message_id, n, "invoice"))

        def second(message_id: str, n: int) -> None:
            with conn.transaction():
                conn.execute(effect, (message_id, n, "invoice"))
                conn.execute(more, (message_id, n, "invoice"))

        more = "INSERT INTO bench_more (message_id, amount, note) VALUES (%s, %s, %s)"
        kinds = {"plain": plain, "inbox": with_inbox, "second": second}
        for warm in range(50):  # the statements prepared (psycopg prepares after 5 runs), the caches warm
            for kind, run in kinds.items():
                run(f"{tag}-warm-{kind}{warm}", warm)
        for block in range(count // BLOCK):
            order = tuple(kinds) if block % 2 == 0 else tuple(reversed(kinds))
            for kind in order:
                started = time.perf_counter()
                for n in range(block * BLOCK, (block + 1) * BLOCK):
                    kinds[kind](f"{tag}-{kind}-{n}", n)
                spent[kind] += time.perf_counter() - started
    done = count // BLOCK * BLOCK
    return {kind: seconds / done * 1e6 for kind, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--transactions", type=int, default=2000)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parents[1]))
    import psycopg

    from outbox_pipelines_tests.scratch import ScratchServer

    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-inbox-")
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS bench_inbox_cost")
            admin.execute("CREATE DATABASE bench_inbox_cost")
        url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="bench_inbox_cost")
        _setup(url)
        for mode in ("on", "off"):
            runs = []
            for run in range(args.runs):
                figures = one_run(url, args.transactions, mode)
                runs.append(figures)
                added = figures["inbox"] / figures["plain"] - 1
                print(
                    f"synchronous_commit={mode} run {run + 1}: plain {figures['plain']:.0f} us, "
                    f"with the inbox {figures['inbox']:.0f} us (+{added:.0%}), "
                    f"with a second INSERT {figures['second']:.0f} us",
                    flush=True,
                )
            plain = statistics.median(r["plain"] for r in runs)
            inbox = statistics.median(r["inbox"] for r in runs)
            ratios = sorted(r["inbox"] / r["plain"] - 1 for r in runs)
            second = statistics.median(r["second"] / r["plain"] - 1 for r in runs)
            verdict = "meets" if statistics.median(ratios) <= TARGET else "misses"
            print(
                f"synchronous_commit={mode}, median of {args.runs} runs of {args.transactions} transactions each: "
                f"plain {plain:.0f} us, with the inbox {inbox:.0f} us per transaction; added: median "
                f"{statistics.median(ratios):+.0%} (runs from {ratios[0]:+.0%} to {ratios[-1]:+.0%}), "
                f"{verdict} the {TARGET:.0%} target; a second one-row INSERT instead adds {second:+.0%}",
                flush=True,
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
