"""Small backlogs: the CLI relay and a running relay at their defaults against the simple loop, two trees in turns.

    git archive HEAD outbox_pipelines sql | tar -x -C /tmp/sb-before      # the tree before a change
    .venv/bin/python bench/small_backlogs.py /tmp/sb-before [AFTER_TREE] [--runs 5] [--messages 1000 10000]

One embedded server (or OUTBOX_TEST_DATABASE_URL's); each tree migrates a database of its own with an outbox table
for itself and one for the simple loop (the loop's own partial index on pending ids, as obench/peers.py). Per run,
in an order shuffled per run, each variant drains ``messages`` rows (loaded untimed, then VACUUM ANALYZE):

- ``cli``: ``python -m outbox_pipelines.cli relay --table T --once --quiet`` (paper destination, every default),
  from the process's spawn to its exit, against the simple loop's process (``python -c`` of a 30-line loop:
  connect, ``SELECT … ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED``, ``UPDATE … WHERE id = ANY``, commit) likewise;
- ``running``: a relay already running (``relay --table T --quiet``, idle, woken by the insert trigger's NOTIFY)
  and the simple loop likewise (LISTEN on the same channel, draining until a claim comes back empty), from the
  commit of the transaction that inserts the rows to the moment the parent sees the last of them settled (both
  drain in id order; polled by primary key every 2 ms, the same for both).

With ``--history``, each table starts as a queue that has kept up (20,000 rows sent, statistics taken while 10 were
pending), the state in which a running relay's kept claim plan is made in a service; ``--skip-cli`` leaves out the
CLI variant.

Prints each run, then per variant the medians (seconds) and the median of the per-run ratios loop / ours [min–max]
(≥ 1 means ours is as fast as the loop), and after / before (ours, the same runs). First, the start-up alone
(``--imports N`` rounds, 0 to skip): the wall time of ``python -c`` importing what ``relay`` imports before its first
statement (``outbox_pipelines.cli`` and the relay command's module), each tree in turns, beside ``import psycopg``
(the loop's own floor).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
THIS_TREE = str(HERE.parents[1])
OURS, LOOP = "bench_small", "bench_small_loop"
FILL = (
    "INSERT INTO {table} (event_id, topic, payload, payload_sha, headers) "
    "SELECT %(tag)s || '-' || n, 'order.created', jsonb_build_object('order', n, 'lines', '[1,2,3]'::jsonb), "
    "'sha256:' || md5(n::text), '{{}}'::jsonb FROM generate_series(1, %(count)s) n"
)
SIMPLE_LOOP = """
import sys, psycopg
url, table, batch, running = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "running"
claim = (f"SELECT id, event_id, topic, payload, headers FROM {table} WHERE status = 'pending' "
         "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED")
settle = f"UPDATE {table} SET status = 'sent', published_at = now(), updated_at = now() WHERE id = ANY(%s)"
def drain(conn):
    with conn.cursor() as cur:
        while True:
            cur.execute(claim, (batch,))
            rows = cur.fetchall()
            if not rows:
                conn.commit()
                return
            cur.execute(settle, ([r[0] for r in rows],))
            conn.commit()
with psycopg.connect(url) as conn:
    if not running:
        drain(conn)
    else:
        listen = psycopg.connect(url, autocommit=True)
        listen.execute(f'LISTEN "outbox:{table}"')
        print("ready", flush=True)
        while True:
            for _ in listen.notifies(timeout=1.0, stop_after=1):
                pass
            drain(conn)
"""


def env_for(tree: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OUTBOX_"))}
    env.update(extra, PYTHONPATH=tree)
    return env


def fill(url: str, table: str, count: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL.format(table=table), {"tag": f"r{time.time_ns()}", "count": count})  # bench table names
        conn.execute(f"VACUUM ANALYZE {table}")


def left(url: str, table: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE status IN ('pending', 'sending')").fetchone()
        return int(row[0]) if row else -1


def cli_once(tree: str, url: str, project: str, count: int, loop: bool) -> float:
    table = LOOP if loop else OURS
    fill(url, table, count)
    if loop:
        command = [sys.executable, "-c", SIMPLE_LOOP, url, table, "100", "once"]
    else:
        command = [sys.executable, "-m", "outbox_pipelines.cli", "relay", "--table", OURS, "--once", "--quiet"]
    env = env_for(tree, {"OUTBOX_DATABASE_URL": url, "OUTBOX_CONFIG": str(Path(project, "outbox.toml"))})
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=project, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or left(url, table) != 0:
        raise RuntimeError(f"{command[2:5]}: rc {done.returncode}, {left(url, table)} left: {done.stderr[-2000:]}")
    return seconds


def start_running(tree: str, url: str, project: str, loop: bool) -> "subprocess.Popen[str]":
    if loop:
        command = [sys.executable, "-u", "-c", SIMPLE_LOOP, url, LOOP, "100", "running"]
    else:
        command = [sys.executable, "-u", "-m", "outbox_pipelines.cli", "relay", "--table", OURS, "--quiet"]
    env = env_for(tree, {"OUTBOX_DATABASE_URL": url, "OUTBOX_CONFIG": str(Path(project, "outbox.toml"))})
    process = subprocess.Popen(command, env=env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if loop:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    else:
        time.sleep(3.0)  # its start-up: imports, session, first (empty) claim, then idle on LISTEN
    return process


def running_once(url: str, table: str, count: int) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as poll, psycopg.connect(url) as writer:
        inserted = writer.execute(
            FILL.format(table=table) + " RETURNING id", {"tag": f"w{time.time_ns()}", "count": count}
        )
        last = max(row[0] for row in inserted.fetchall())
        writer.commit()
        committed = time.perf_counter()
        # Both drain in id order, one batch at a time: the last row is in the last batch. A lookup by primary key,
        # so that polling costs the machine next to nothing.
        statement = f"SELECT status IN ('pending', 'sending') FROM {table} WHERE id = %s"
        while poll.execute(statement, (last,)).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.002)
            if time.perf_counter() - committed > 120:
                raise RuntimeError(f"{table}: not drained in 120 s")
        return time.perf_counter() - committed


def tree_database(tree: str, admin_url: str, name: str, statements: list[str]) -> str:
    """A new database ``name`` migrated by ``tree``'s code (a process of its own), then ``statements`` run on it, each
    on its own (bench constants, never input); its url. bench/emptied_queue.py's too."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    script = (
        "import json, sys, psycopg\nfrom outbox_pipelines.core.storage import migrate\nmigrate.upgrade(sys.argv[1])\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
        "    for statement in json.loads(sys.argv[2]):\n"
        "        c.execute(statement)\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, url, json.dumps(statements)], env=env_for(tree, {}), check=True, cwd="/"
    )
    return url


def quiet_history(table: str) -> list[str]:
    """A queue that has kept up: 20,000 rows sent, its statistics taken while 10 were pending (bench constants)."""
    return [
        f"INSERT INTO {table} (event_id, topic, payload, payload_sha, headers) SELECT 'h-' || n, 'order.created', "
        "jsonb_build_object('order', n), 'sha256:' || md5(n::text), '{}'::jsonb FROM generate_series(1, 20000) n",
        f"UPDATE {table} SET status = 'sent', published_at = now() WHERE id > 10",
        f"VACUUM ANALYZE {table}",
        f"UPDATE {table} SET status = 'sent', published_at = now() WHERE status = 'pending'",
    ]


def prepare(tree: str, admin_url: str, name: str, history: bool = False) -> str:
    """The tree's database with our table and the simple loop's (its own index on pending ids); with ``history``,
    each table as a queue that has kept up (``quiet_history``)."""
    return tree_database(
        tree,
        admin_url,
        name,
        [
            f"SELECT outbox_create_table('{OURS}')",
            f"SELECT outbox_create_table('{LOOP}')",
            f"CREATE INDEX simple_loop_pending ON {LOOP} (id) WHERE status = 'pending'",
        ]
        + (quiet_history(OURS) + quiet_history(LOOP) if history else []),
    )


def imports(trees: dict[str, str], rounds: int) -> None:
    """The start-up's imports, timed as whole processes: each tree's, and psycopg's alone, in a shuffled order."""
    relay_imports = "import outbox_pipelines.cli, outbox_pipelines.cli.relay_commands"
    variants = [("psycopg alone", THIS_TREE, "import psycopg")] + [(t, trees[t], relay_imports) for t in trees]
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    rng = random.Random(7)
    for _ in range(rounds):
        rng.shuffle(variants)
        for name, tree, code in variants:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env_for(tree, {}), cwd="/", check=True)
            times[name].append(time.perf_counter() - started)
    print(f"\nstart-up: python -c '{relay_imports}', process spawn to exit, medians of {rounds} [min–max]")
    for name, values in times.items():
        low, high = min(values) * 1000, max(values) * 1000
        print(f"  {name:13s} {statistics.median(values) * 1000:5.0f} ms [{low:.0f}–{high:.0f}]")
    ratios = sorted(a / b for a, b in zip(times["after"], times["before"], strict=True))
    print(f"  after / before {statistics.median(ratios):.2f} [{ratios[0]:.2f}–{ratios[-1]:.2f}]", flush=True)


def report(name: str, results: list[dict[str, float]], trees: list[str]) -> None:
    print(f"\n{name}: medians in seconds; ratio = loop / ours (its throughput against the loop's), median [min–max]")
    for tree in trees:
        ours = statistics.median(r[f"{tree}"] for r in results)
        loop = statistics.median(r[f"{tree}-loop"] for r in results)
        ratios = sorted(r[f"{tree}-loop"] / r[tree] for r in results)
        print(
            f"  {tree:7s} ours {ours:.3f} s, loop {loop:.3f} s, ratio {statistics.median(ratios):.2f} "
            f"[{ratios[0]:.2f}–{ratios[-1]:.2f}]"
        )
    gains = sorted(r["after"] / r["before"] for r in results)
    print(f"  ours after / before (time): {statistics.median(gains):.2f} [{gains[0]:.2f}–{gains[-1]:.2f}]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before_tree")
    parser.add_argument("after_tree", nargs="?", default=THIS_TREE)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--skip-running", action="store_true", help="only the CLI relay (process start to exit)")
    parser.add_argument("--skip-cli", action="store_true", help="only the running relay")
    parser.add_argument(
        "--history",
        action="store_true",
        help="each table a queue that has kept up: 20,000 rows sent, statistics taken while 10 were pending",
    )
    parser.add_argument(
        "--imports", type=int, default=15, metavar="N", help="rounds of the start-up's imports (0: none)"
    )
    args = parser.parse_args()
    sys.path.insert(0, THIS_TREE)
    from outbox_pipelines_tests.scratch import ScratchServer

    trees = {"before": os.path.abspath(args.before_tree), "after": os.path.abspath(args.after_tree)}
    for tree in trees.values():  # each tree imports from its bytecode, as an installed package does (a tree made by
        # git archive has none, and PYTHONDONTWRITEBYTECODE would leave it so: each import compiled from source)
        subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tree}/outbox_pipelines"], check=True)
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-small-")
    rng = random.Random(47)
    running: list[subprocess.Popen[str]] = []
    try:
        urls = {
            name: prepare(tree, server.admin_url, f"bench_small_{name}", args.history) for name, tree in trees.items()
        }
        print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
        if args.imports:
            imports(trees, args.imports)
        with tempfile.TemporaryDirectory() as project:
            Path(project, "outbox.toml").write_text(
                f'shipped_tables = false\n[tables.{OURS}]\ndestination = "paper"\n', encoding="utf-8"
            )
            for count in [] if args.skip_cli else args.messages:
                variants = [(t, loop) for t in trees for loop in (False, True)]
                cli_once(trees["after"], urls["after"], project, 200, False)  # warm-up: caches, pyc files
                results = []
                for run in range(args.runs):
                    rng.shuffle(variants)
                    figures = {}
                    for tree, loop in variants:
                        seconds = cli_once(trees[tree], urls[tree], project, count, loop)
                        figures[f"{tree}-loop" if loop else tree] = seconds
                    results.append(figures)
                    print(f"cli {count} run {run + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
                report(f"CLI relay --once, {count:,} messages, process spawn to exit", results, list(trees))
            if not args.skip_running:
                for tree in trees:
                    for loop in (False, True):
                        running.append(start_running(trees[tree], urls[tree], project, loop))
                for count in args.messages:
                    results = []
                    for run in range(args.runs):
                        variants = [(t, loop) for t in trees for loop in (False, True)]
                        rng.shuffle(variants)
                        figures = {}
                        for tree, loop in variants:
                            seconds = running_once(urls[tree], LOOP if loop else OURS, count)
                            figures[f"{tree}-loop" if loop else tree] = seconds
                        results.append(figures)
                        print(
                            f"running {count} run {run + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items())
                        )
                    report(f"running relay, {count:,} messages, enqueue commit to last settle", results, list(trees))
        print(f"\nload average {os.getloadavg()[0]:.2f} at end")
    finally:
        for process in running:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        server.stop()


if __name__ == "__main__":
    main()
