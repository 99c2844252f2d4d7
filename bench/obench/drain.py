"""drain: pending messages claimed, delivered to a no-op destination and settled.

Measured against what a user would otherwise pick, in the same run, rounds
interleaved (the order rotates each round so the machine's drift cancels):

- the simple loop (obench.peers.simple_drain): one transaction per batch,
  ``SELECT ... FOR UPDATE SKIP LOCKED`` -> no-op handler -> one
  ``UPDATE ... WHERE id = ANY(...)``, no lease, attempts or audit;
- ours, ``run_table_relay(..., once=True, destination=NoopDestination())`` per worker
  process (what the CLI relay and the Dagster op call), with each claim setting (auto, the default /
  lease / transaction) and audit setting (all, the default / failures);
- at default settings, ours (every TableSettings default but competing mode,
  so 4 processes share the table) against pgqueuer 1.6 (obench.peers.pgqueuer_drain_worker) at the same
  batch size (its run(batch_size=100)) and at its own defaults (batch_size 10), same messages and processes.
"""

import time
from typing import Any

import psycopg

from obench import peers
from obench.common import (
    Barrier,
    Figure,
    NoopDestination,
    ScenarioResult,
    Sizes,
    Target,
    copy_rows,
    count_by_status,
    log,
    make_rows,
    reset_table,
    run_processes,
    settle_server,
)

TABLE = "outbox_orders"
# (claim, audit) settings measured at batch 1,000; the first is the shipped default.
SETTINGS = (
    ("auto", "all"),
    ("lease", "all"),
    ("lease", "failures"),
    ("transaction", "all"),
    ("transaction", "failures"),
)
# Issue 28: the default within 20 % of the simple loop in one process; issue 12's for the others.
TARGETS = {
    ("auto", "all", 1): Target("≥ 0.8× simple loop (defaults, full audit)", ratio_min=0.8),
    ("transaction", "all", 4): Target("≥ 0.7× simple loop (full audit trail)", ratio_min=0.7),
    ("transaction", "all", 1): Target("≥ 0.7× simple loop (full audit trail)", ratio_min=0.7),
    ("transaction", "failures", 4): Target("≥ 0.9× simple loop (failures-only audit)", ratio_min=0.9),
    ("transaction", "failures", 1): Target("≥ 0.9× simple loop (failures-only audit)", ratio_min=0.9),
}


def ours_worker(
    url: str, table_name: str, overrides: dict[str, Any], index: int, barrier: Barrier
) -> tuple[float, float, int]:
    """One process of ours, through run_table_relay: what `outbox-pipelines relay` and the Dagster op run."""
    from outbox_pipelines.core.relay import run_table_relay
    from outbox_pipelines.core.settings import GlobalSettings, Settings, TableSettings

    table = TableSettings(name=table_name, **{"mode": "competing", "on_success": "mark_sent", **overrides})
    settings = Settings(GlobalSettings.from_env({}), {table_name: table}, None)
    barrier()
    started = time.monotonic()
    report = run_table_relay(
        url, settings, table_name, once=True, worker_id=f"bench-ours-{index}", destination=NoopDestination()
    )
    return started, time.monotonic(), report.sent


def drain_once(url: str, kind: str, workers: int, rows: list[Any], overrides: dict[str, Any]) -> float:
    """Load the rows, drain them with ``workers`` processes; return messages per second (checked)."""
    reset_table(url, TABLE)
    with psycopg.connect(url, autocommit=True) as conn:
        copy_rows(conn, TABLE, rows)
    if kind == "simple":
        jobs = [(peers.simple_drain_worker, (url, TABLE, overrides["batch_size"], i)) for i in range(workers)]
        with peers.simple_loop_index(url, TABLE):
            settle_server(url, TABLE)
            results = run_processes(jobs, timeout_s=900)
    else:
        settle_server(url, TABLE)
        jobs = [(ours_worker, (url, TABLE, overrides, i)) for i in range(workers)]
        results = run_processes(jobs, timeout_s=900)
    started = min(r[0] for r in results)
    finished = max(r[1] for r in results)
    sent = sum(r[2] for r in results)
    counts = count_by_status(url, TABLE)
    if sent != len(rows) or counts.get("sent", 0) != len(rows):
        raise RuntimeError(f"drain {kind} x{workers}: {sent} reported sent, table has {counts}, expected {len(rows)}")
    return sent / (finished - started)


def _label(claim: str, audit: str) -> str:
    return f"claim={claim}, audit={audit}"


def _compare_settings(url: str, sizes: Sizes, runs: int, rows: list[Any], result: ScenarioResult) -> None:
    batch = sizes.drain_batch
    for workers in (1, 4):
        kinds = ["simple", *(_label(c, a) for c, a in SETTINGS)]
        rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        for run_index in range(runs):
            shift = run_index % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                overrides: dict[str, Any] = {"batch_size": batch}
                if kind != "simple":
                    claim, audit = (part.split("=")[1] for part in kind.split(", "))
                    overrides |= {"claim": claim, "audit": audit}
                rate = drain_once(url, kind, workers, rows, overrides)
                rates[kind].append(rate)
                log(f"  drain x{workers} run {run_index + 1}/{runs} {kind:34s} {rate:9,.0f} msg/s")
        for claim, audit in SETTINGS:
            result.figures.append(
                Figure(
                    "drain",
                    f"drain {_label(claim, audit)}, {workers} worker{'s' if workers > 1 else ''} "
                    f"(batch {batch:,}, {sizes.drain_messages:,} msgs)",
                    "msg/s",
                    rates[_label(claim, audit)],
                    rates["simple"],
                    "simple loop: FOR UPDATE SKIP LOCKED, no-op, UPDATE ... WHERE id = ANY, one txn per batch",
                    TARGETS.get((claim, audit, workers)),
                    note="the shipped default" if (claim, audit) == SETTINGS[0] else "",
                )
            )
        result.details[f"drain_x{workers}_msg_per_s"] = rates


DEFAULT_BATCH = 100  # TableSettings.batch_size


def _compare_defaults(url: str, sizes: Sizes, runs: int, rows: list[Any], result: ScenarioResult) -> None:
    """Ours at default settings against pgqueuer at the same batch size and at its own defaults, 4 processes each."""
    workers = 4
    kinds = ("ours", "pgqueuer-batch-100", "pgqueuer")
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    peers.pgqueuer_install(url)
    for run_index in range(runs):
        shift = run_index % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            if kind == "ours":
                rate = drain_once(url, "ours", workers, rows, {})
            elif kind == "pgqueuer":
                rate = peers.pgqueuer_drain_once(url, workers, len(rows))
            else:
                rate = peers.pgqueuer_drain_once(url, workers, len(rows), batch_size=DEFAULT_BATCH)
            rates[kind].append(rate)
            log(f"  defaults x{workers} run {run_index + 1}/{runs} {kind:18s} {rate:9,.0f} msg/s")
    note = "ours: every TableSettings default (batch 100, claim=auto, audit=all) but mode=competing"
    references = (
        (
            "pgqueuer-batch-100",
            "pgqueuer at the same batch",
            "pgqueuer 1.6, run(batch_size=100), psycopg driver, same messages and processes",
            Target("≥ 1.5× pgqueuer at the same batch", ratio_min=1.5),
        ),
        (
            "pgqueuer",
            "pgqueuer at its defaults",
            "pgqueuer 1.6 at its defaults (batch_size 10, psycopg driver), same messages and processes",
            Target("≥ 2× pgqueuer", ratio_min=2.0),
        ),
    )
    for kind, versus, reference, target in references:
        label = f"drain at default settings, {workers} processes ({len(rows):,} msgs), {versus}"
        result.figures.append(Figure("drain", label, "msg/s", rates["ours"], rates[kind], reference, target, note=note))
    result.details["defaults_msg_per_s"] = rates


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    rows = make_rows(sizes.drain_messages, "order.created", "drain")
    _compare_settings(url, sizes, runs, rows, result)
    _compare_defaults(url, sizes, runs, rows, result)
    return result
