"""What a claim's byte budget saves a relay's memory (issue 42, a table's ``batch_bytes``).

Rows larger than anyone meant (written by SQL, or stored before the database held a payload limit): ``--rows``
pending rows of ``--mib`` MiB each. A relay in a process of its own drains them once, at the default batch size
(100), with the default budget (16 MiB) and with a budget too large to cut anything (2 GiB: the claim before issue
42); it reports how much its resident memory grew (VmHWM after minus before) and how long the drain took. The two
take turns, ``--runs`` times; medians are printed, and the ratio of the medians.

    .venv/bin/python bench/claim_budget.py --runs 3 --rows 30 --mib 10

The server is OUTBOX_BENCH_DATABASE_URL's, else an embedded one started (and stopped) here.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import psycopg

from outbox_pipelines_tests.scratch import ScratchServer, TemplateDatabases

TABLE = "bench_outbox"
MIB = 1024 * 1024
BUDGETS = {"default budget (16 MiB)": 16 * MIB, "no budget (2 GiB)": 2 * 1024 * MIB}

# The relay's own process: it reads VmHWM (the most it ever held resident) before and after draining.
RELAY = """
import json, sys, time
from outbox_pipelines.core.destinations.paper import PaperBroker
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.conftest import table_settings

def hwm_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

settings = table_settings(sys.argv[2], mode="competing", idle_sleep_s=0.01, batch_bytes=int(sys.argv[3]))
relay = Relay(sys.argv[1], settings, PaperBroker())
before, started = hwm_kib(), time.perf_counter()
report = relay.run(once=True)
print(json.dumps({"grew_mib": (hwm_kib() - before) / 1024, "seconds": time.perf_counter() - started,
                  "sent": report.sent}))
"""


def _fill(url: str, rows: int, mib: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT outbox_set_payload_limit(%s, NULL)", (TABLE,))  # rows over any limit, as if older
        conn.execute(
            f"INSERT INTO {TABLE} (event_id, topic, payload, payload_sha) "  # TABLE is this file's constant
            "SELECT 'big-' || n, 't', jsonb_build_object('blob', repeat('x', %s)), 's' FROM generate_series(1, %s) n",
            (mib * MIB, rows),
        )


def _drain(url: str, budget: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RELAY, url, TABLE, str(budget)], capture_output=True, text=True, timeout=900, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--mib", type=int, default=10)
    args = parser.parse_args()
    server = ScratchServer.from_env("OUTBOX_BENCH_DATABASE_URL", dir_prefix="outbox-bench-budget-")
    figures: dict[str, list[dict]] = {name: [] for name in BUDGETS}
    try:
        databases = TemplateDatabases(server.admin_url, prefix=f"bench_budget{os.getpid()}", parts=())
        with psycopg.connect(databases.url_for(databases.template), autocommit=True) as conn:
            conn.execute("SELECT outbox_create_table(%s)", (TABLE,))
        for run in range(args.runs):
            for name, budget in BUDGETS.items():
                database, url = databases.create_database(f"r{run}")
                try:
                    _fill(url, args.rows, args.mib)
                    result = _drain(url, budget)
                finally:
                    databases.drop_database(database)
                assert result["sent"] == args.rows, result
                figures[name].append(result)
                print(f"run {run + 1}/{args.runs} {name}: +{result['grew_mib']:.0f} MiB, {result['seconds']:.1f} s")
        databases.drop_template()
    finally:
        server.stop()
    print(f"\n{args.rows} rows of {args.mib} MiB, batch size 100, medians of {args.runs} runs:")
    medians = {}
    for name, runs in figures.items():
        medians[name] = (statistics.median(r["grew_mib"] for r in runs), statistics.median(r["seconds"] for r in runs))
        print(f"- {name}: resident memory +{medians[name][0]:.0f} MiB, drained in {medians[name][1]:.1f} s")
    (budget_mib, budget_s), (none_mib, none_s) = medians.values()
    print(f"- the budget holds {budget_mib / none_mib:.2f}x the memory, in {budget_s / none_s:.2f}x the time")


if __name__ == "__main__":
    main()
