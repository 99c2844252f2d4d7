"""Where a drain's time goes: database time per statement and client time per message.

One process drains 100,000 messages at batch 1,000 to a no-op destination, in this process so its calls
can be timed: the simple loop, ours with claim = "lease" (the default before issue 28) and with the
default settings (claim = "auto", audit = "all"). For each, per message: the wall time of each kind of
database call as the client sees it (the server's execution, the round trip and the driver; at batch
1,000 a round trip on the local socket is well under 0.1 µs a message, so this is the server's time),
and the rest, the client's own time (Python: building parameters, decoding rows, planning settlements,
counting, the relay's threads).

Run: ``.venv/bin/python bench/obench/breakdown.py`` (it starts its own embedded PostgreSQL, or uses
OUTBOX_BENCH_DATABASE_URL; about two minutes). Prints a Markdown table for bench/results.md.
"""

import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from obench import peers
from obench.common import BenchServer, NoopDestination, copy_rows, make_rows, reset_table, settle_server

TABLE = "outbox_orders"
MESSAGES = 100_000
BATCH = 1_000
ROUNDS = 3


class Timer:
    """Wall time of the database calls, by label, as the client sees them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, label: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)


def _drain_ours(url: str, overrides: dict[str, Any]) -> tuple[float, Timer]:
    from outbox_pipelines.core.relay import run_table_relay
    from outbox_pipelines.core.settings import GlobalSettings, Settings, TableSettings
    from outbox_pipelines.core.storage import shared_tables, table_claims

    timer = Timer()
    undo = [
        timer.wrap(table_claims.ClaimStatements, "claim", "claim"),
        timer.wrap(table_claims.ClaimStatements, "claim_held", "claim"),
        timer.wrap(table_claims.ClaimStatements, "settle_sent", "settle"),
        timer.wrap(table_claims.ClaimStatements, "lease_held", "lease at hold"),
        timer.wrap(shared_tables.SharedTables, "note_held_batch", "note the held batch"),
        timer.wrap(psycopg.Connection, "commit", "commit"),
    ]
    table = TableSettings(
        name=TABLE, **{"mode": "competing", "on_success": "mark_sent", "batch_size": BATCH, **overrides}
    )
    settings = Settings(GlobalSettings.from_env({}), {TABLE: table}, None)
    try:
        t0 = time.perf_counter()
        report = run_table_relay(url, settings, TABLE, once=True, destination=NoopDestination())
        elapsed = time.perf_counter() - t0
    finally:
        for u in undo:
            u()
    assert report.sent == MESSAGES, report
    return elapsed, timer


def _drain_simple(url: str) -> tuple[float, Timer]:
    timer = Timer()
    undo = [timer.wrap(psycopg.Cursor, "execute", "claim / settle"), timer.wrap(psycopg.Connection, "commit", "commit")]
    try:
        with peers.simple_loop_index(url, TABLE):
            t0 = time.perf_counter()
            with psycopg.connect(url, autocommit=False) as conn:
                sent = peers.simple_drain(conn, TABLE, BATCH)
            elapsed = time.perf_counter() - t0
    finally:
        for u in undo:
            u()
    assert sent == MESSAGES
    return elapsed, timer


def main() -> None:
    server = BenchServer()
    try:
        _, url = server.create_database("breakdown")
        rows = make_rows(MESSAGES, "order.created", "breakdown")
        kinds = {
            "simple loop": lambda: _drain_simple(url),
            "lease, audit all (the default before)": lambda: _drain_ours(url, {"claim": "lease", "audit": "all"}),
            "auto, audit all (the default now)": lambda: _drain_ours(url, {}),
            "transaction, audit all": lambda: _drain_ours(url, {"claim": "transaction", "audit": "all"}),
        }
        results: dict[str, list[tuple[float, Timer]]] = defaultdict(list)
        for round_index in range(ROUNDS):
            for name, drain in kinds.items():
                reset_table(url, TABLE)
                with psycopg.connect(url, autocommit=True) as conn:
                    copy_rows(conn, TABLE, rows)
                settle_server(url, TABLE)
                elapsed, timer = drain()
                results[name].append((elapsed, timer))
                print(f"round {round_index + 1} {name}: {MESSAGES / elapsed:,.0f} msg/s", flush=True)
        _print_table(results)
    finally:
        server.close()


def _print_table(results: dict[str, list[tuple[float, Timer]]]) -> None:
    print(f"\n| per message (µs), medians of {ROUNDS} rounds | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    Pick = Callable[[tuple[float, Timer]], float]
    rows: list[tuple[str, Pick]] = [
        ("drain rate (msg/s)", lambda r: MESSAGES / r[0]),
        ("wall time", lambda r: r[0] / MESSAGES * 1e6),
    ]
    calls = sorted({label for runs in results.values() for r in runs for label in r[1].seconds})
    for label in calls:
        rows.append((f"database: {label}", lambda r, label=label: r[1].seconds.get(label, 0.0) / MESSAGES * 1e6))
    rows.append(
        ("client's own time (wall − database calls)", lambda r: (r[0] - sum(r[1].seconds.values())) / MESSAGES * 1e6)
    )
    for title, pick in rows:
        cells = []
        for name in results:
            value = statistics.median(pick(r) for r in results[name])
            cells.append(f"{value:,.0f}" if "rate" in title else f"{value:.2f}")
        print(f"| {title} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
