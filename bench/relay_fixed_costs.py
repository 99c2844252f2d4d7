"""The relay's fixed costs: its database round trips per batch and per invocation, and the CLI relay's start-up.

    .venv/bin/python bench/relay_fixed_costs.py [--tree /tmp/before] [--messages 2000] [--batch 100] [--runs 3]
    .venv/bin/python bench/relay_fixed_costs.py --compare /tmp/before --messages 20000 --runs 5   # two trees in turns

One embedded server (or OUTBOX_TEST_DATABASE_URL's), a database migrated by the tree measured (``--tree``, this
one by default). Every round trip a relay process makes is counted by wrapping ``psycopg.Connection.wait`` (each
statement, commit, BEGIN, LISTEN: one wait each; a notification poll with a timeout is not a round trip and is
listed apart), labelled by the named query (``outbox_claim``…) or the engine function that sent it, and by the
connection (the relay's, the lease keeper's, a goodbye's). Three measurements, each in a fresh process:

- ``held``: ``Relay.run(once=True)`` into a no-op destination (the default path: claim = "auto", batch held);
- ``pipelined``: the same into a no-op destination marked ``pipelined`` (what the broker destinations are);
- ``cli``: ``outbox-pipelines relay --table T --once --quiet`` (paper destination, defaults), timestamps from
  the process's start: imports, settings, schema checks, session, first claim, last settle, exit.

Prints, per measurement, a table: label, connection, round trips per invocation and per batch, median ms each.
Then ``python -X importtime`` of the CLI: the heaviest imports.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
THIS_TREE = str(HERE.parents[1])
TABLE = "bench_fixed"
FILL = (
    "INSERT INTO bench_fixed (event_id, topic, payload, payload_sha, headers) "
    "SELECT %(tag)s || '-' || n, 'order.created', jsonb_build_object('order', n, 'lines', '[1,2,3]'::jsonb), "
    "'sha256:' || md5(n::text), '{}'::jsonb FROM generate_series(1, %(count)s) n"
)

# -- the child: counts every round trip ----------------------------------------------------------------------

EVENTS: list[tuple[float, float, str, str, str]] = []  # (start, seconds, label, connection, thread)
STAMPS: dict[str, float] = {}


def _label(frame: Any) -> str:
    """The named query (a local ``query`` of the engine's runners) or the first engine function up the stack."""
    sql_text = None
    named = None
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if "psycopg" in path and code.co_name in ("execute", "_execute_gen") and sql_text is None:
            query = frame.f_locals.get("query")
            if isinstance(query, (str, bytes)):
                sql_text = (query.decode() if isinstance(query, bytes) else query).split()[0:2]
        if "outbox_pipelines" in path and "/bench/" not in path:
            if code.co_name in ("_run", "_claimed", "_run_shared", "_fetch_shared", "_one") and named is None:
                query = frame.f_locals.get("query") or frame.f_locals.get("name")
                if isinstance(query, str):
                    named = query
            elif "storage/statements.py" not in path and "storage/queries.py" not in path:
                where = f"{Path(path).parent.name}/{Path(path).stem}.{code.co_name}"
                if named:
                    return f"{named} ({where})"
                if sql_text:
                    return f"{' '.join(sql_text)[:24]} ({where})"
                return where
        frame = frame.f_back
    return named or (" ".join(sql_text) if sql_text else "?")


def install_counter() -> None:
    import threading

    import psycopg

    names: dict[int, str] = {}
    original = psycopg.Connection.wait

    def wait(self: Any, gen: Any, interval: Any = None, timeout: float | None = None) -> Any:
        label = _label(sys._getframe(1))
        if timeout is not None:
            label = "(notification poll: no round trip)"
        conn = names.setdefault(id(self), f"conn{len(names) + 1}")
        wall, started = time.time(), time.perf_counter()
        try:
            if interval is None:
                return original(self, gen, timeout=timeout)
            return original(self, gen, interval, timeout)
        finally:
            EVENTS.append((wall, time.perf_counter() - started, label, conn, threading.current_thread().name))

    psycopg.Connection.wait = wait  # type: ignore[method-assign]


def summary(batches: int) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for _, seconds, label, conn, thread in EVENTS:
        groups[(label, conn, "keeper" if "keeper" in thread.lower() or "lease" in thread.lower() else thread)].append(
            seconds
        )
    return [
        {
            "label": label,
            "conn": conn,
            "thread": thread,
            "count": len(times),
            "per_batch": len(times) / max(batches, 1),
            "median_ms": statistics.median(times) * 1000,
            "total_ms": sum(times) * 1000,
        }
        for (label, conn, thread), times in sorted(groups.items(), key=lambda kv: min(e for e in kv[1]))
    ]


def child_relay(url: str, kind: str, messages: int, batch: int, counted: bool = True) -> None:
    import psycopg

    from outbox_pipelines.core.destinations.base import Destination
    from outbox_pipelines.core.models import Outcome
    from outbox_pipelines.core.relay import Relay
    from outbox_pipelines.core.settings import TableSettings

    sent = Outcome.sent()

    class Noop(Destination):
        name = "noop"
        pipelined = kind == "pipelined"

        def deliver(self, batch_: Any) -> list[Outcome]:
            return [sent] * len(batch_)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL, {"tag": f"{kind}-{time.time_ns()}", "count": messages})
        conn.execute("VACUUM ANALYZE bench_fixed")
    settings = TableSettings(name=TABLE, batch_size=batch, audit=os.environ.get("BENCH_AUDIT", "all"))
    if counted:
        install_counter()
    machine, own, started = machine_busy_s(), time.process_time(), time.perf_counter()
    report = Relay(url, settings, Noop(), worker_id=f"bench-{kind}").run(once=True)
    seconds = time.perf_counter() - started
    cpu = {
        "machine_cpu_s": machine_busy_s() - machine,  # every process's: the relay, the server's, anything else
        "relay_cpu_s": time.process_time() - own,
    }
    batches = -(-report.sent // batch)
    print(json.dumps({"sent": report.sent, "seconds": seconds, "batches": batches, **cpu, "rows": summary(batches)}))


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core; /proc/stat, less idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def child_cli(spawned: float) -> None:
    STAMPS["interpreter"] = time.time() - spawned
    install_counter()
    from outbox_pipelines.cli import main as cli_main

    STAMPS["imports"] = time.time() - spawned
    code = cli_main(["relay", "--table", TABLE, "--once", "--quiet"])
    STAMPS["returned"] = time.time() - spawned
    claims = [e for e in EVENTS if "outbox_claim" in e[2]]
    settles = [e for e in EVENTS if "outbox_settle" in e[2] and not e[2].startswith("SAVEPOINT")]
    if EVENTS:
        STAMPS["first round trip"] = EVENTS[0][0] - spawned
    if claims:
        STAMPS["first claim sent"] = claims[0][0] - spawned
        STAMPS["first claim back"] = claims[0][0] + claims[0][1] - spawned
    if settles:
        STAMPS["last settle back"] = settles[-1][0] + settles[-1][1] - spawned
    batches = max(len(settles), 1)
    print(json.dumps({"code": code, "stamps": STAMPS, "rows": summary(batches), "batches": batches}))


# -- the parent ---------------------------------------------------------------------------------------------


def run_child(tree: str, args: list[str], cwd: str, env_extra: dict[str, str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OUTBOX_"))}
    env.update(env_extra, PYTHONPATH=tree)
    spawned = time.time()
    out = subprocess.run(
        [sys.executable, str(HERE), *args, str(spawned)], env=env, capture_output=True, text=True, cwd=cwd, check=False
    )
    ended = time.time() - spawned
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed: {out.stdout[-2000:]} {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["process_s"] = ended
    return result


def table(rows_runs: list[list[dict[str, Any]]]) -> list[str]:
    merged: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    order: list[tuple[str, str]] = []
    for rows in rows_runs:
        for row in rows:
            key = (row["label"], row["conn"])
            if key not in merged:
                order.append(key)
            merged[key].append(row)
    out = [
        "| statement (engine function) | connection | thread | count | per batch | median ms |",
        "|---|---|---|---|---|---|",
    ]
    for key in order:
        rows = merged[key]
        out.append(
            f"| {key[0]} | {key[1]} | {rows[0]['thread']} | {statistics.median(r['count'] for r in rows):g} "
            f"| {statistics.median(r['per_batch'] for r in rows):.2f} "
            f"| {statistics.median(r['median_ms'] for r in rows):.3f} |"
        )
    return out


def importtime(tree: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OUTBOX_"))}
    env["PYTHONPATH"] = tree
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import outbox_pipelines.cli"],
        env=env,
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    )
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, self_us, cumulative, name = line.split("|", 3)[0].split(":")[0], *line.split(":", 1)[1].split("|")
        rows.append((int(cumulative), int(self_us), name.rstrip()))
    top = [r for r in rows if r[2].count("  ") <= 1]  # top-level imports (indent 1)
    total = sum(r[0] for r in top)
    lines = [f"import outbox_pipelines.cli: {total / 1000:.0f} ms cumulative; heaviest imports (cumulative ms):"]
    heavy = sorted(rows, key=lambda r: -r[0])
    seen = 0
    for cumulative, _, name in heavy:
        if name.strip().startswith(("dagster", "opentelemetry", "prometheus", "httpx", "psycopg", "outbox_pipelines")):
            lines.append(f"  {cumulative / 1000:7.1f}  {name.strip()}")
            seen += 1
        if seen >= 14:
            break
    return lines


def migrate(tree: str, admin_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")  # the bench's own names
        admin.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    script = (
        "import sys, psycopg\nfrom outbox_pipelines.core.storage import migrate\nmigrate.upgrade(sys.argv[1])\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
        "    c.execute('SELECT outbox_create_table(%s)', ('bench_fixed',))\n"
    )
    subprocess.run([sys.executable, "-c", script, url], env={**os.environ, "PYTHONPATH": tree}, check=True, cwd="/")
    return url


def compare(before: str, after: str, admin_url: str, messages: int, runs: int) -> None:
    """The relay into a no-op destination (held, the default path; pipelined, the brokers' path) at batch 100 and
    1,000, the two trees in a rotating order, each drain a fresh process; msg/s medians and after / before, and the
    CPU milliseconds a batch the machine spent during the drains (/proc/stat), and of it the server's (the machine's
    less the relay process's own): steadier than msg/s on a machine whose processes' speed varies by a third."""
    import random

    trees = {"before": before, "after": after}
    urls = {name: migrate(tree, admin_url, f"bench_fixed_{name}") for name, tree in trees.items()}
    variants = [(t, k, b) for t in trees for k in ("held", "pipelined") for b in (100, 1000)]
    rates: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    machine_ms: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    server_ms: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    rng = random.Random(47)
    print(f"load average {os.getloadavg()[0]:.2f} at start")
    for run in range(runs):
        rng.shuffle(variants)
        for tree, kind, batch in variants:
            result = run_child(
                trees[tree], ["--child-relay", urls[tree], kind, str(messages), str(batch), "plain"], "/", {}
            )
            rates[(tree, kind, batch)].append(result["sent"] / result["seconds"])
            per_batch = 1000 / max(result["batches"], 1)
            machine_ms[(tree, kind, batch)].append(result["machine_cpu_s"] * per_batch)
            server_ms[(tree, kind, batch)].append((result["machine_cpu_s"] - result["relay_cpu_s"]) * per_batch)
        print(f"run {run + 1} done", flush=True)
    print(
        f"\n| path, batch | before msg/s | after msg/s | after / before | machine CPU ms a batch, before → after "
        f"| of it the server's and the rest, before → after | ({messages:,} messages, {runs} runs) |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind in ("held", "pipelined"):
        for batch in (100, 1000):
            b, a = rates[("before", kind, batch)], rates[("after", kind, batch)]
            ratios = sorted(x / y for x, y in zip(a, b, strict=True))
            cpu = [statistics.median(m[(tree, kind, batch)]) for m in (machine_ms, server_ms) for tree in trees]
            print(
                f"| {kind}, {batch} | {statistics.median(b):,.0f} | {statistics.median(a):,.0f} "
                f"| {statistics.median(ratios):.2f} [{ratios[0]:.2f}–{ratios[-1]:.2f}] "
                f"| {cpu[0]:.2f} → {cpu[1]:.2f} | {cpu[2]:.2f} → {cpu[3]:.2f} | |"
            )
    print(f"load average {os.getloadavg()[0]:.2f} at end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=THIS_TREE, help="the tree whose relay is measured (default: this one)")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--audit", default="all", help="the table's audit setting (all, the default; failures)")
    parser.add_argument(
        "--compare", metavar="BEFORE_TREE", help="no counting: drains of BEFORE_TREE and --tree in turns"
    )
    args = parser.parse_args()
    sys.path.insert(0, THIS_TREE)
    import psycopg

    from outbox_pipelines_tests.scratch import ScratchServer

    tree = os.path.abspath(args.tree)
    os.environ["BENCH_AUDIT"] = args.audit  # the relay children's table setting
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-fixed-")
    if args.compare:
        try:
            compare(os.path.abspath(args.compare), tree, server.admin_url, args.messages, args.runs)
        finally:
            server.stop()
        return
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS bench_fixed_costs")
            admin.execute("CREATE DATABASE bench_fixed_costs")
        url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="bench_fixed_costs")
        script = (
            "import sys, psycopg\nfrom outbox_pipelines.core.storage import migrate\nmigrate.upgrade(sys.argv[1])\n"
            "with psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
            "    c.execute('SELECT outbox_create_table(%s)', ('bench_fixed',))\n"
        )
        subprocess.run([sys.executable, "-c", script, url], env={**os.environ, "PYTHONPATH": tree}, check=True, cwd="/")
        print(f"tree {tree}; {args.messages} messages, batch {args.batch}; load {os.getloadavg()[0]:.2f}\n")
        for kind in ("held", "pipelined"):
            results = [
                run_child(tree, ["--child-relay", url, kind, str(args.messages), str(args.batch)], "/", {})
                for _ in range(args.runs)
            ]
            rate = statistics.median(r["sent"] / r["seconds"] for r in results)
            print(f"## {kind}: Relay.run(once=True), no-op destination: {rate:,.0f} msg/s (median)\n")
            print("\n".join(table([r["rows"] for r in results])) + "\n")
        with tempfile.TemporaryDirectory() as project:
            Path(project, "outbox.toml").write_text(
                f'shipped_tables = false\n[tables.{TABLE}]\ndestination = "paper"\n', encoding="utf-8"
            )
            env = {"OUTBOX_DATABASE_URL": url, "OUTBOX_CONFIG": str(Path(project, "outbox.toml"))}
            results = []
            for _ in range(args.runs):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(FILL, {"tag": f"cli-{time.time_ns()}", "count": args.messages})
                    conn.execute("VACUUM ANALYZE bench_fixed")
                results.append(run_child(tree, ["--child-cli"], project, env))
            print(f"## cli: outbox-pipelines relay --table {TABLE} --once ({args.messages} messages, paper)\n")
            stamps = sorted(results[0]["stamps"])
            for name in sorted(stamps, key=lambda s: results[0]["stamps"][s]):
                print(f"- {name}: {statistics.median(r['stamps'][name] for r in results) * 1000:.0f} ms after spawn")
            print(f"- process exit: {statistics.median(r['process_s'] for r in results) * 1000:.0f} ms after spawn\n")
            print("\n".join(table([r["rows"] for r in results])) + "\n")
        print("\n".join(importtime(tree)))
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-relay":
        child_relay(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] != "plain")
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-cli":
        child_cli(float(sys.argv[2]))
    else:
        main()
