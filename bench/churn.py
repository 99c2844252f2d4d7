"""Tables that stay small (issue 41, item 6): a day of churn with time moved, and a million audit rows deleted.

    .venv/bin/python bench/churn.py day              # 24 h at 500 msg/s, then a snapshot held for an hour (~1 h)
    .venv/bin/python bench/churn.py audit --runs 3   # 1,000,000 old audit rows deleted beside writers (~3 min)
    .venv/bin/python bench/churn.py day --hours 2 --rate 50   # a quick pass
    .venv/bin/python bench/churn.py render           # bench/churn.md again from bench/churn.json

**day** — 24 simulated hours at 500 messages a second, one simulated minute at a time: the producers'
30,000 messages (``Outbox.enqueue_many``, 1,000 a call), the relay's drain of them (``run_table_relay``,
what ``outbox-pipelines relay`` runs, to a no-op destination), and at minute 7 of every hour the cleaner
(``clean_tables``, what ``clean_hourly`` runs). Nothing waits for wall time: the cleaner's clock is
injected. The time the database stamped at the end of each simulated minute is recorded, and the cleaner
of simulated time S runs with ``now`` = (the stamp of minute S - retention - 1) + retention, so it deletes
exactly the rows delivered more than the retention ago in simulated time. The table is declared with a
2-hour retention (sent rows and audit alike; the shipped 168 h and 30 d would not turn over within one
day), ``db upgrade`` (``upgrade_project``) creates it and gives it and the audit their autovacuum
settings, and real autovacuum cleans up behind. The embedded server's ``autovacuum_naptime`` is 2 s
instead of 60: time runs about 30 times faster than the wall clock here, and the launcher's nap is the
one setting counted in wall seconds that would otherwise visit the table every half simulated hour;
vacuum's own speed is not scaled, so autovacuum has about 1/30 of the wall time it would have per
simulated minute (a harder day than a real one).

Every 15 simulated minutes: rows kept, table and index bytes of the outbox table and the audit, dead
tuples, autovacuum runs, the drain rate of the last minute. The bound is stated before the run: each
table with its indexes stays within **2x the packed size of the most rows its retention keeps**
(rate x (retention + the cleaner's hour): 5.4M messages at 500/s and 2 h). Packed size: the table
copied at the end into a fresh one with the same indexes, its bytes per row times that many rows.

Then a report's session opens a REPEATABLE READ snapshot and stays open while the churn goes on for an
hour of simulated time: the vacuum check (``sweep``, what the on-call sensor runs, its clock moved by the
simulated time the snapshot has been held) must fire, and once the session ends and autovacuum has
caught up, clear; each alert is counted.

**audit** — 1,000,000 audit rows older than the 30-day retention and 100,000 newer, then the cleaner's
audit pass (``clean_shared``) while another process writes, one transaction at a time, an audit row and an
outbox message in turns: the longest and the p99 of those writes during the cleanup, against the same
before it. Medians over ``--runs`` fresh databases. ``--dead N``: messages 1..N of the table still dead, whose
audit rows (the oldest) the cleaner keeps: what keeping them costs.

Results: bench/churn.md (each part's latest run, with its command, commit and machine) and bench/churn.json.
"""

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
from obench.code_version import measured_code  # noqa: E402
from obench.common import NoopDestination, log, percentile  # noqa: E402
from psycopg import sql  # noqa: E402

from outbox_pipelines import Message, Outbox  # noqa: E402
from outbox_pipelines.core.oncall.database_health import CONDITION_KEY, vacuum_verdicts  # noqa: E402
from outbox_pipelines.core.oncall.sweep import sweep  # noqa: E402
from outbox_pipelines.core.operations.maintenance import clean_shared, clean_tables  # noqa: E402
from outbox_pipelines.core.operations.upgrade import upgrade_project  # noqa: E402
from outbox_pipelines.core.relay import run_table_relay  # noqa: E402
from outbox_pipelines.core.settings import Settings, load_settings, parse_duration  # noqa: E402
from outbox_pipelines.core.settings.declarations import Declaration  # noqa: E402
from outbox_pipelines_tests.scratch import ScratchServer, TemplateDatabases  # noqa: E402

TABLE = "churn_outbox"
OUT_MD, OUT_JSON = REPO / "bench" / "churn.md", REPO / "bench" / "churn.json"
BOUND = 2.0  # each table with its indexes <= BOUND x the packed size of the most rows its retention keeps
CLEANER_MINUTE = 7  # clean_hourly: "7 * * * *"
SAMPLE_EVERY = 15  # simulated minutes
PAYLOAD = {
    "order_id": "ord-000000000",
    "customer_id": "cus-00000",
    "amount_cents": 12345,
    "currency": "EUR",
    "lines": [{"sku": "sku-001", "qty": 2}, {"sku": "sku-002", "qty": 1}],
    "note": "benchmark message",
}


def _server() -> ScratchServer:
    return ScratchServer.from_env(
        "OUTBOX_BENCH_DATABASE_URL",
        dir_prefix="outbox-churn-pg-",
        starting=lambda data_dir: log(f"starting an embedded PostgreSQL under {data_dir}"),
    )


def _value(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# -- day ---------------------------------------------------------------------------------------------------


def _settings(retention: str, batch: int) -> Settings:
    section = {"destination": "paper", "mode": "competing", "batch_size": batch, "retention": retention}
    return load_settings(env={}, declaration=Declaration({TABLE: section}))


def _enqueue(conn: psycopg.Connection[Any], minute: int, n: int) -> None:
    outbox = Outbox(TABLE)
    for start in range(0, n, 1000):
        batch = [
            Message(topic="order.created", payload=PAYLOAD, event_id=f"m{minute}-{i}")
            for i in range(start, min(n, start + 1000))
        ]
        outbox.enqueue_many(conn, batch, outside_transaction=True)


def _sample(conn: psycopg.Connection[Any], minute: int, drain_rate: float) -> dict[str, Any]:
    figures: dict[str, Any] = {"minute": minute, "hour": round(minute / 60, 2), "drain_msg_s": round(drain_rate)}
    for name, key in ((TABLE, "outbox"), ("outbox_audit", "audit")):
        stats = conn.execute(
            "SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_dead_tup, s.autovacuum_count "
            "FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid WHERE c.relname = %s",
            (name,),
        ).fetchone()
        assert stats is not None
        rows = _value(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name)).as_string(conn))
        figures[key] = {
            "rows": int(rows),
            "table_bytes": int(stats[0]),
            "index_bytes": int(stats[1]),
            "dead_tuples": int(stats[2]),
            "autovacuums": int(stats[3]),
        }
    return figures


def _packed_bytes_per_row(conn: psycopg.Connection[Any], name: str) -> float:
    """The table copied into a fresh one with the same indexes: its bytes (table + indexes) per row."""
    copy = sql.Identifier(f"{name}_packed")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(copy))
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(copy, sql.Identifier(name)))
    conn.execute(sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM {}").format(copy, sql.Identifier(name)))
    rows = _value(conn, sql.SQL("SELECT count(*) FROM {}").format(copy).as_string(conn))
    size = _value(
        conn,
        "SELECT pg_table_size(%s::regclass) + pg_indexes_size(%s::regclass)",
        copy.as_string(conn),
        copy.as_string(conn),
    )
    conn.execute(sql.SQL("DROP TABLE {}").format(copy))
    return float(size) / max(int(rows), 1)


class Day:
    """One simulated day on a fresh database: the minutes, their stamps, the samples."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.retention_s = parse_duration(args.retention, "--retention")
        self.settings = _settings(args.retention, args.batch)
        self.per_minute = int(args.rate * 60)
        self.stamps: list[datetime] = []
        self.samples: list[dict[str, Any]] = []
        self.cleaner_s: list[float] = []
        self.conn = psycopg.connect(url, autocommit=True)

    def minute(self, m: int) -> float:
        """Enqueue a simulated minute's messages, drain them, clean on the hour's minute 7; the drain's rate."""
        _enqueue(self.conn, m, self.per_minute)
        started = time.monotonic()
        report = run_table_relay(
            self.url, self.settings, TABLE, once=True, worker_id=f"churn-{m}", destination=NoopDestination()
        )
        drain = report.sent / max(time.monotonic() - started, 1e-6)
        self.stamps.append(_value(self.conn, "SELECT now()"))
        due = m - int(self.retention_s // 60) - 1  # the last simulated minute older than the retention
        if m % 60 == CLEANER_MINUTE and due >= 0:
            now = self.stamps[due] + timedelta(seconds=self.retention_s, microseconds=1)
            began = time.monotonic()
            clean_tables(lambda: self.url, [self.settings.tables[TABLE]], audit_retention_s=self.retention_s, now=now)
            self.cleaner_s.append(time.monotonic() - began)
        return drain

    def run(self, minutes: range) -> None:
        for m in minutes:
            drain = self.minute(m)
            if m % SAMPLE_EVERY == SAMPLE_EVERY - 1:
                self.samples.append(_sample(self.conn, m + 1, drain))
                s = self.samples[-1]
                log(
                    f"  hour {s['hour']:5.2f}: {s['outbox']['rows']:,} rows, "
                    f"{(s['outbox']['table_bytes'] + s['outbox']['index_bytes']) / 2**20:,.0f} MiB, "
                    f"{s['outbox']['dead_tuples']:,} dead, {s['outbox']['autovacuums']} autovacuums; audit "
                    f"{s['audit']['rows']:,} rows {_mib(s['audit']['table_bytes'] + s['audit']['index_bytes'])}; "
                    f"drain {drain:,.0f} msg/s"
                )

    def sim_now(self, held_since_real: datetime, held_since_minute: int) -> datetime:
        """The checks' clock: the database's, moved on by the simulated time since the hold began."""
        real = _value(self.conn, "SELECT now()")
        simulated = timedelta(minutes=len(self.stamps) - held_since_minute)
        return real + (simulated - (real - held_since_real))


def _vacuum_state(day: Day, now: datetime) -> dict[str, Any]:
    with psycopg.connect(day.url, autocommit=True) as conn:
        verdict = vacuum_verdicts(conn, day.settings, [TABLE], now=now)[TABLE]
    report = sweep(day.url, day.settings, now=now, webhook_url="")
    told = [f"{a['status']} {a['severity']}" for a in report.alerts if a["alert_key"] == CONDITION_KEY]
    return {"severity": verdict.severity, "description": verdict.description, "alerts": told}


def _hold(day: Day, hold_minutes: int) -> dict[str, Any]:
    """A report's REPEATABLE READ snapshot held while the churn goes on; the check before, during, after."""
    result: dict[str, Any] = {"before": _vacuum_state(day, _value(day.conn, "SELECT now()"))}
    holder = psycopg.connect(day.url, application_name="churn-report")
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    holder.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(TABLE)))
    since, since_minute = _value(day.conn, "SELECT now()"), len(day.stamps)
    start = len(day.stamps)
    states = []
    for m in range(start, start + hold_minutes):
        day.run(range(m, m + 1))
        if (m - start + 1) in (5, 15, 30, hold_minutes):
            state = _vacuum_state(day, day.sim_now(since, since_minute))
            state["held_min"] = m - start + 1
            states.append(state)
            log(f"  held {state['held_min']} min: {state['severity']}, alerts {state['alerts']}")
    result["held"] = states
    result["held_sample"] = _sample(day.conn, len(day.stamps), 0.0)
    holder.rollback()
    holder.close()
    released, cleared_after = len(day.stamps), None
    clear_states = []
    real_start = time.monotonic()
    for m in range(released, released + 60):
        day.run(range(m, m + 1))
        state = _vacuum_state(day, _value(day.conn, "SELECT now()"))
        clear_states.append(state)
        if state["severity"] == "ok":
            cleared_after = m - released + 1
            break
    result["cleared_after_min"] = cleared_after
    result["cleared_after_wall_s"] = round(time.monotonic() - real_start, 1)
    result["after"] = clear_states[-1] if clear_states else None
    result["alerts_while_clearing"] = [a for s in clear_states for a in s["alerts"]]
    result["after_sample"] = _sample(day.conn, len(day.stamps), 0.0)
    return result


def run_day(args: argparse.Namespace) -> dict[str, Any]:
    server = _server()
    try:
        if server.embedded:
            with psycopg.connect(server.admin_url, autocommit=True) as admin:
                admin.execute("ALTER SYSTEM SET autovacuum_naptime = '2s'")
                admin.execute("SELECT pg_reload_conf()")
        _, url = TemplateDatabases(server.admin_url, prefix=f"churn{os.getpid()}", parts=()).create_database()
        day = Day(url, args)
        upgrade = upgrade_project(url, day.settings)
        assert upgrade.autovacuum is not None
        log(f"day: db upgrade set autovacuum on {sorted(upgrade.autovacuum.applied)}")
        t0 = time.monotonic()
        day.run(range(int(args.hours * 60)))
        day_wall_s = time.monotonic() - t0
        packed = {
            key: _packed_bytes_per_row(day.conn, name) for name, key in ((TABLE, "outbox"), ("outbox_audit", "audit"))
        }
        most_rows = args.rate * (day.retention_s + 3600)  # what the retention keeps just before the hourly cleaner
        bound = {key: BOUND * packed[key] * most_rows for key in packed}
        hold = _hold(day, args.hold) if args.hold else None
        return {
            "hours": args.hours,
            "rate": args.rate,
            "retention": args.retention,
            "batch_size": args.batch,
            "messages": int(args.hours * 60) * day.per_minute,
            "wall_s": round(day_wall_s),
            "compression": round(args.hours * 3600 / day_wall_s, 1),
            "autovacuum_settings": {t: o for t, o in upgrade.autovacuum.applied.items()},
            "naptime": "2s" if server.embedded else "the server's",
            "packed_bytes_per_row": {k: round(v, 1) for k, v in packed.items()},
            "most_rows_kept": int(most_rows),
            "bound_bytes": {k: int(v) for k, v in bound.items()},
            "cleaner_s_median": round(statistics.median(day.cleaner_s), 2) if day.cleaner_s else None,
            "cleaner_s_max": round(max(day.cleaner_s), 2) if day.cleaner_s else None,
            "samples": day.samples,
            "hold": hold,
        }
    finally:
        server.stop()


# -- audit -------------------------------------------------------------------------------------------------


def _writer(url: str, stop: Any, out: Any) -> None:
    """Writes one audit row, then one outbox message, each its own transaction, ~200 a second; their times."""
    times: list[tuple[float, str, float]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        outbox, i = Outbox(TABLE), 0
        while not stop.is_set():
            began = time.monotonic()
            if i % 2 == 0:
                conn.execute(
                    "INSERT INTO outbox_audit (outbox_table, code, worker) VALUES (%s, 'bench', 'writer')", (TABLE,)
                )
                kind = "audit"
            else:
                with conn.transaction():
                    outbox.enqueue(conn, Message(topic="t", payload=PAYLOAD, event_id=f"w{i}"))
                kind = "outbox"
            times.append((began, kind, time.monotonic() - began))
            i += 1
            time.sleep(max(0.0, 0.005 - (time.monotonic() - began)))
    out.put(times)


def _audit_once(admin_url: str, index: int, rows: int, dead: int = 0) -> dict[str, Any]:
    name, url = TemplateDatabases(admin_url, prefix=f"churn_audit{os.getpid()}_{index}", parts=()).create_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT outbox_create_table(%s)", (TABLE,))
        if dead:  # messages 1..dead still dead: the cleaner keeps their (oldest) audit rows, whatever the retention
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (event_id, topic, payload, payload_sha) "
                    "SELECT 'dead-' || g, 't', '{{}}', 'sha256:x' FROM generate_series(1, %s) AS g"
                ).format(sql.Identifier(TABLE)),
                (dead,),
            )
            conn.execute(
                sql.SQL("UPDATE {} SET status = 'dead', last_error_code = 'BAD_REQUEST'").format(sql.Identifier(TABLE))
            )
        conn.execute(
            "INSERT INTO outbox_audit (outbox_table, message_id, code, worker, detail, created_at) "
            "SELECT %s, g, 'outbox_flush_success', 'relay-1', 'delivered', "
            "now() - interval '40 days' + make_interval(secs => g * 0.7) FROM generate_series(1, %s) AS g",
            (TABLE, rows),
        )
        conn.execute(
            "INSERT INTO outbox_audit (outbox_table, message_id, code, worker, detail) "
            "SELECT %s, g, 'outbox_flush_success', 'relay-1', 'delivered' FROM generate_series(1, %s) AS g",
            (TABLE, rows // 10),
        )
        conn.execute("VACUUM (ANALYZE) outbox_audit")
        conn.execute("CHECKPOINT")
        before_bytes = _value(conn, "SELECT pg_total_relation_size('outbox_audit')")
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=_writer, args=(url, stop, out))
    writer.start()
    try:
        time.sleep(3.0)  # the writers' baseline, before the cleanup
        began = time.monotonic()
        batches: list[float] = []
        last = [began]

        def batch_done(_: str) -> None:
            now = time.monotonic()
            batches.append(now - last[0])
            last[0] = now

        report = clean_shared(url, audit_retention_s=30 * 86400.0, progress=batch_done)
        ended = time.monotonic()
        time.sleep(1.0)
    finally:
        stop.set()
        times = out.get(timeout=60)
        writer.join(timeout=30)
        if writer.is_alive():
            writer.terminate()
    during = [t for t in times if began <= t[0] <= ended or began <= t[0] + t[2] <= ended]
    baseline = [t for t in times if t[0] + t[2] < began]
    with psycopg.connect(url, autocommit=True) as conn:
        left_old = _value(conn, "SELECT count(*) FROM outbox_audit WHERE created_at < now() - interval '30 days'")
    TemplateDatabases(admin_url, prefix=f"churn_audit{os.getpid()}_{index}", parts=()).drop_database(name)
    ms = 1000.0
    return {
        "deleted": report.deleted_audit,
        "left_old": int(left_old),
        "seconds": round(ended - began, 2),
        "rows_per_s": round(report.deleted_audit / (ended - began)),
        "batches": len(batches),
        "longest_batch_ms": round(max(batches) * ms, 1) if batches else None,
        "audit_bytes_before": int(before_bytes),
        "writes_during": len(during),
        "max_insert_ms": round(max((t[2] for t in during), default=0.0) * ms, 2),
        "max_audit_insert_ms": round(max((t[2] for t in during if t[1] == "audit"), default=0.0) * ms, 2),
        "max_outbox_enqueue_ms": round(max((t[2] for t in during if t[1] == "outbox"), default=0.0) * ms, 2),
        "p99_insert_ms": round(percentile([t[2] for t in during], 99) * ms, 2),
        "baseline_max_ms": round(max((t[2] for t in baseline), default=0.0) * ms, 2),
        "baseline_p99_ms": round(percentile([t[2] for t in baseline], 99) * ms, 2),
    }


def run_audit(args: argparse.Namespace) -> dict[str, Any]:
    server = _server()
    try:
        runs = []
        for index in range(args.runs):
            runs.append(_audit_once(server.admin_url, index, args.rows, args.dead))
            r = runs[-1]
            log(
                f"audit run {index + 1}: {r['deleted']:,} rows in {r['seconds']} s ({r['rows_per_s']:,}/s, "
                f"{r['batches']} batches, longest {r['longest_batch_ms']} ms); writes during: max "
                f"{r['max_insert_ms']} ms, p99 {r['p99_insert_ms']} ms (before: max {r['baseline_max_ms']} ms)"
            )
        keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
        return {
            "rows": args.rows,
            "dead": args.dead,
            "runs": runs,
            "median": {k: statistics.median(r[k] for r in runs if r[k] is not None) for k in keys},
        }
    finally:
        server.stop()


# -- report ------------------------------------------------------------------------------------------------


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _machine(meta: dict[str, Any]) -> str:
    """The machine, and how busy it was (a shared machine: other processes' load slows the simulated day)."""
    load = (
        f"; load average {meta['load_start']} at start, {meta['load_end']} at end"
        if "load_start" in meta and "load_end" in meta
        else ""
    )
    return meta["machine"] + load


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Tables that stay small: churn and audit cleanup",
        "",
        "Written by `bench/churn.py` (its docstring says how).",
        "",
    ]
    day, audit = results.get("day"), results.get("audit")
    if day:
        d, meta = day["result"], day["meta"]
        lines += [
            f"## A day of churn ({meta['when']}, `{meta['command']}`, commit {meta['commit']})",
            "",
            _machine(meta),
            "",
        ]
        lines += [
            f"{d['messages']:,} messages: {d['hours']} h at {d['rate']} msg/s, retention {d['retention']} (sent "
            f"rows and audit), relay batch {d['batch_size']}, simulated in {d['wall_s']:,} s of wall time "
            f"({d['compression']}x); autovacuum_naptime {d['naptime']}; autovacuum settings from db upgrade: "
            f"`{json.dumps(d['autovacuum_settings'])}`.",
            f"Cleaner run (hourly): median {d['cleaner_s_median']} s, longest {d['cleaner_s_max']} s.",
            "",
        ]
        day_samples = [s for s in d["samples"] if s["minute"] <= d["hours"] * 60]
        for key in ("outbox", "audit"):
            sizes = [s[key]["table_bytes"] + s[key]["index_bytes"] for s in day_samples]
            steady, peak, packed = sizes[len(sizes) // 2 :], max(sizes), d["bound_bytes"][key] / BOUND
            within = "within" if peak <= d["bound_bytes"][key] else "OVER"
            lines.append(
                f"- **{key}**: packed {d['packed_bytes_per_row'][key]:.0f} bytes a row (table + indexes); the most "
                f"rows kept {d['most_rows_kept']:,}, packed {_mib(packed)}; bound {BOUND:g}x = "
                f"{_mib(d['bound_bytes'][key])}; largest over the day {_mib(peak)} (**{peak / packed:.2f}x** "
                f"packed), median of the second half {_mib(statistics.median(steady))} "
                f"({statistics.median(steady) / packed:.2f}x): **{within} the bound**."
            )
        lines += [
            "",
            "| hour | outbox rows | outbox table + indexes | dead tuples | autovacuums | audit rows "
            "| audit table + indexes | drain msg/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in d["samples"]:
            if s["minute"] % 60 and s["minute"] <= d["hours"] * 60:
                continue  # the day by the hour; the hold after it by the quarter
            o, a = s["outbox"], s["audit"]
            lines.append(
                f"| {s['hour']:g} | {o['rows']:,} | {_mib(o['table_bytes'])} + {_mib(o['index_bytes'])} "
                f"| {o['dead_tuples']:,} | {o['autovacuums']} | {a['rows']:,} "
                f"| {_mib(a['table_bytes'])} + {_mib(a['index_bytes'])} | {s['drain_msg_s']:,} |"
            )
        if d.get("hold"):
            h = d["hold"]
            lines += [
                "",
                "**A REPEATABLE READ snapshot held while the churn goes on** (the vacuum check through `sweep`):",
                "",
            ]
            lines.append(f"- before: {h['before']['severity']}; alerts {h['before']['alerts'] or 'none'}")
            for s in h["held"]:
                lines.append(
                    f"- held {s['held_min']} simulated min: **{s['severity']}**, alerts {s['alerts'] or 'none'}: "
                    f"{s['description']}"
                )
            hs, as_ = h["held_sample"]["outbox"], h["after_sample"]["outbox"]
            lines.append(
                f"- at the release: {hs['dead_tuples']:,} dead tuples, {_mib(hs['table_bytes'] + hs['index_bytes'])}; "
                f"cleared after {h['cleared_after_min']} simulated min ({h['cleared_after_wall_s']} s of wall time, "
                f"real autovacuum), alerts {h['alerts_while_clearing'] or 'none'}; then {as_['dead_tuples']:,} "
                "dead tuples, "
                f"{_mib(as_['table_bytes'] + as_['index_bytes'])}: {h['after']['description'] if h['after'] else '-'}"
            )
        lines.append("")
    if audit:
        a, meta = audit["result"], audit["meta"]
        m = a["median"]
        lines += [
            f"## Deleting {a['rows']:,} old audit rows beside writers ({meta['when']}, `{meta['command']}`, "
            f"commit {meta['commit']})",
            "",
            _machine(meta),
            "",
        ]
        if a.get("dead"):
            lines += [
                f"Messages 1 to {a['dead']:,} are still dead: the cleaner keeps their audit rows (the oldest "
                f"{a['dead']:,}), and the longest batch counts the read of which rows those are, before the first.",
                "",
            ]
        lines += [
            f"Medians of {len(a['runs'])} runs: {m['deleted']:,.0f} rows deleted in {m['seconds']} s "
            f"({m['rows_per_s']:,.0f} rows/s, {m['batches']:.0f} batches, the longest {m['longest_batch_ms']} ms); "
            f"the writers' longest insert during the cleanup **{m['max_insert_ms']} ms** (audit row "
            f"{m['max_audit_insert_ms']} ms, outbox enqueue {m['max_outbox_enqueue_ms']} ms), p99 "
            f"{m['p99_insert_ms']} ms; before it: longest {m['baseline_max_ms']} ms, p99 {m['baseline_p99_ms']} ms.",
            "",
            "| run | deleted | seconds | rows/s | longest batch ms | longest insert ms | p99 ms | before: longest ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, r in enumerate(a["runs"], 1):
            lines.append(
                f"| {i} | {r['deleted']:,} | {r['seconds']} | {r['rows_per_s']:,} | {r['longest_batch_ms']} "
                f"| {r['max_insert_ms']} | {r['p99_insert_ms']} | {r['baseline_max_ms']} |"
            )
        lines.append("")
    return "\n".join(lines)


def _meta(argv: list[str]) -> dict[str, Any]:
    commit, dirty = measured_code(["outbox_pipelines", "sql", "bench"])
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    return {
        "when": datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": "python bench/churn.py " + " ".join(argv),
        "commit": f"{commit}{' + uncommitted changes' if dirty else ''}",
        "machine": f"{os.cpu_count()} CPUs ({cpu}), {platform.platform()}, Python {platform.python_version()}",
        "load_start": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("day", "audit", "all", "render"), help="render: churn.md from churn.json")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (24)")
    parser.add_argument("--rate", type=float, default=500.0, help="messages a simulated second (500)")
    parser.add_argument("--retention", default="2h", help="the table's retention of sent rows and the audit's (2h)")
    parser.add_argument("--batch", type=int, default=1000, help="the relay's batch_size (1000)")
    parser.add_argument("--hold", type=int, default=60, help="simulated minutes a snapshot is held after the day (60)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="old audit rows to delete (1,000,000)")
    parser.add_argument(
        "--dead", type=int, default=0, help="audit: messages still dead, whose audit rows the cleaner keeps (0)"
    )
    parser.add_argument("--runs", type=int, default=3, help="audit: fresh databases, the median reported (3)")
    args = parser.parse_args(argv)
    results = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {}
    meta = _meta(argv)
    if args.part in ("audit", "all"):
        results["audit"] = {"meta": meta, "result": run_audit(args)}
        meta["load_end"] = round(os.getloadavg()[0], 2)
        OUT_JSON.write_text(json.dumps(results, indent=1, default=str) + "\n")
    if args.part in ("day", "all"):
        meta = {**meta, "load_start": round(os.getloadavg()[0], 2)}
        results["day"] = {"meta": meta, "result": run_day(args)}
        meta["load_end"] = round(os.getloadavg()[0], 2)
        OUT_JSON.write_text(json.dumps(results, indent=1, default=str) + "\n")
    OUT_MD.write_text(render(results) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
