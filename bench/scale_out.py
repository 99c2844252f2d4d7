"""scale: how far more relay processes go, as a user scales out: real `outbox-pipelines relay` processes.

One competing-mode table holds N pending messages (COPY, VACUUM ANALYZE, CHECKPOINT, as in every
scenario); K = 1, 2, 4 and 8 relay processes are started together, each

    outbox-pipelines relay --table bench_scale --once --quiet --json --worker-id ...

(``--once``: drain what is ready, exit when a claim comes back empty), with OUTBOX_DATABASE_URL naming
this scenario's database and OUTBOX_CONFIG a generated outbox.toml. Then 4 tables at once: four
tables holding N/4 messages each (the same N in total, so the figure compares with one table), one
relay process per table. Then 50 tables (N/50 each), relayed by relay groups (issue 23): one
``outbox-pipelines relay --group G --once`` process per group, with 1 group and with 4. The
destination is in-process handlers, ``scale_out:registry`` below (a
no-op handler; the relays import this module through PYTHONPATH=bench/), one handler thread, the
table's default batch of 100 unless --scale-batch says otherwise.

Two figures per layout, both from the database's clock:

- launch → all sent: N / (last ``published_at`` - ``clock_timestamp()`` read just before the first
  process is started). It includes what starting a process costs (interpreter, imports, connect):
  what a user gets by starting K more relays for a backlog.
- first relay connected → all sent: N / (last ``published_at`` - earliest ``started_at`` in
  ``outbox_relay_workers``): the relays' rate once they run, what long-lived relays sustain.

The bench polls the tables (cheap EXISTS on the partial indexes) until nothing is pending or
sending, and records its own monotonic launch → done time as a cross-check. Rounds are interleaved
(K=1, 2, 4, 8, 4 tables; then again), the median over --runs rounds is reported with its range, and
the ratio column is the speed-up over one relay process in the same round. Every process is stopped
by its pid if it is still running at the end; its stdout/stderr go to bench/.runs/scale-<time>/.
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from obench.common import Figure, Row, ScenarioResult, Sizes, copy_rows, log, make_rows, settle_server
from psycopg import sql

from outbox_pipelines.core.destinations.handlers import HandlerRegistry
from outbox_pipelines.core.models import ClaimedMessage

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TOPIC = "bench.scale"
ONE_TABLE = "bench_scale"
FOUR_TABLES = tuple(f"bench_scale_{i}" for i in range(1, 5))
# Issue 23: a platform's 50 module tables, relayed by relay groups (`relay --group`), one process per group.
FIFTY_TABLES = tuple(f"bench_mod_{i:02d}" for i in range(50))
PROCESS_COUNTS = (1, 2, 4, 8)
DEFAULT_MESSAGES, QUICK_MESSAGES = 40_000, 8_000
DEFAULT_BATCH = 100  # the shipped default (OUTBOX_BATCH_SIZE): what a user's relays claim
POLL_S = 0.05
DRAIN_TIMEOUT_S = 900.0

# -- the destination the relay processes load (handlers = "scale_out:registry") --

registry = HandlerRegistry()


def _accept(message: ClaimedMessage) -> None:
    """Accept every message at once: what remains is the relay's own cost."""
    return None


registry.register(TOPIC, _accept)


# -- options (registered on bench/run.py's parser) -----------------------------

_options: dict[str, int | None] = {"messages": None, "batch": None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scale-messages",
        type=int,
        metavar="N",
        help=f"scale: messages per measurement (default {DEFAULT_MESSAGES:,}; "
        f"--quick {QUICK_MESSAGES:,}); the 4-table layout holds N/4 per table",
    )
    parser.add_argument(
        "--scale-batch",
        type=int,
        metavar="B",
        help=f"scale: the relays' batch size (default {DEFAULT_BATCH}, the shipped default)",
    )


def configure(args: argparse.Namespace) -> None:
    _options["messages"] = args.scale_messages
    _options["batch"] = args.scale_batch


# -- one measurement -----------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    name: str
    tables: tuple[str, ...]
    processes_per_table: int
    # Relay groups instead: one `relay --group` process per group, the tables spread over them in turn.
    groups: int = 0

    @property
    def processes(self) -> int:
        return self.groups or len(self.tables) * self.processes_per_table

    def group_of(self, table: str) -> str:
        return f"g{self.groups}_{self.tables.index(table) % self.groups + 1}"


@dataclass
class Measurement:
    launch_rate: float
    busy_rate: float
    bench_clock_rate: float
    first_connect_s: float
    last_connect_s: float
    drain_s: float
    sent_per_relay: list[int] = field(default_factory=list)


def _cli() -> list[str]:
    """The outbox-pipelines command next to this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "outbox-pipelines"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("outbox-pipelines")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from outbox_pipelines.cli import main; sys.exit(main())"]


def _relay_env(url: str, config: Path) -> dict[str, str]:
    """The environment a user's relay gets: the database URL and the settings file, nothing else of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["OUTBOX_DATABASE_URL"] = url
    env["OUTBOX_CONFIG"] = str(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def write_config(path: Path, batch: int, groups: Layout | None = None) -> None:
    """The scenario's tables; with ``groups``, the 50 module tables spread over its relay groups."""
    sections = []
    for table in (ONE_TABLE, *FOUR_TABLES, *FIFTY_TABLES):
        group = f'group = "{groups.group_of(table)}"\n' if groups is not None and table in groups.tables else ""
        sections.append(
            f'[tables.{table}]\ndestination = "handlers"\nhandlers = "scale_out:registry"\nmode = "competing"\n'
            f'on_success = "mark_sent"\nbatch_size = {batch}\nparallelism = 1\n{group}'
        )
    path.write_text("# Generated by bench/scale_out.py for the scale scenario.\n\n" + "\n".join(sections))


def _load(url: str, layout: Layout, rows: list[Row]) -> None:
    """Empty every table of the scenario, the audit and the relay registry; load ``rows`` split over the layout."""
    names = [
        sql.Identifier(t) for t in (ONE_TABLE, *FOUR_TABLES, *FIFTY_TABLES, "outbox_audit", "outbox_relay_workers")
    ]
    share = len(rows) // len(layout.tables)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(sql.SQL(", ").join(names)))
        for i, table in enumerate(layout.tables):
            copy_rows(conn, table, rows[i * share : (i + 1) * share])
    settle_server(url, *layout.tables)


class Relays:
    """The relay processes of one measurement, each stopped by its pid if still running at the end."""

    def __init__(self, layout: Layout, env: dict[str, str], log_dir: Path, tag: str) -> None:
        self.layout, self.env, self.log_dir, self.tag = layout, env, log_dir, tag
        self.procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []

    def start(self) -> None:
        if self.layout.groups:
            for group in sorted({self.layout.group_of(table) for table in self.layout.tables}):
                self._start(f"{self.tag}-{group}", ["relay", "--group", group, "--once", "--quiet", "--json"])
            return
        for table in self.layout.tables:
            for i in range(self.layout.processes_per_table):
                worker = f"{self.tag}-{table}-{i + 1}"
                self._start(worker, ["relay", "--table", table, "--once", "--quiet", "--json", "--worker-id", worker])

    def _start(self, name: str, args: list[str]) -> None:
        out, err = self.log_dir / f"{name}.json", self.log_dir / f"{name}.log"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [*_cli(), *args], env=self.env, cwd=self.log_dir, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
            )
        self.procs.append((proc, out, err))

    def check(self) -> bool:
        """True once every process has exited; a failed one raises with its log's tail."""
        done = True
        for proc, _, err in self.procs:
            code = proc.poll()
            if code is None:
                done = False
            elif code != 0:
                tail = err.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"relay pid {proc.pid} exited {code}; {err}:\n{tail}")
        return done

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"relays still running {timeout_s:.0f} s after the tables were drained")
            time.sleep(POLL_S)

    def reports(self) -> list[dict[str, Any]]:
        """One report per process: a relay's, or a group's with its tables' sent added up."""
        reports = [json.loads(out.read_text().strip().splitlines()[-1]) for _, out, _ in self.procs]
        return [{"sent": sum(t["sent"] for t in r["tables"].values())} if "tables" in r else r for r in reports]

    def stop(self) -> None:
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()  # SIGTERM: the relay settles its batch in flight and exits
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def _unfinished(conn: psycopg.Connection, tables: tuple[str, ...]) -> bool:
    """Anything pending or sending left? EXISTS on the partial indexes: cheap while the relays work."""
    probe = sql.SQL(" OR ").join(
        sql.SQL(
            "EXISTS (SELECT 1 FROM {t} WHERE status = 'pending') OR EXISTS (SELECT 1 FROM {t} WHERE status = 'sending')"
        ).format(t=sql.Identifier(t))
        for t in tables
    )
    row = conn.execute(sql.SQL("SELECT ") + probe).fetchone()
    return bool(row and row[0])


def _db_times(conn: psycopg.Connection, tables: tuple[str, ...]) -> tuple[Any, Any, Any, dict[str, int]]:
    """(first relay started, last relay started, last published) and the rows per status, all tables together."""
    first, last = conn.execute("SELECT min(started_at), max(started_at) FROM outbox_relay_workers").fetchone() or (
        None,
        None,
    )
    union = sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT status, published_at FROM {}").format(sql.Identifier(t)) for t in tables
    )
    rows = conn.execute(
        sql.SQL("SELECT status, count(*), max(published_at) FROM (") + union + sql.SQL(") u GROUP BY status")
    ).fetchall()
    published = max((r[2] for r in rows if r[2] is not None), default=None)
    return first, last, published, {r[0]: int(r[1]) for r in rows}


def measure(url: str, layout: Layout, rows: list[Row], env: dict[str, str], log_dir: Path, tag: str) -> Measurement:
    _load(url, layout, rows)
    expected = len(rows) // len(layout.tables) * len(layout.tables)
    if layout.groups:  # this layout's groups: a settings file of its own
        config = log_dir / f"outbox-{layout.groups}-groups.toml"
        write_config(config, int(env["SCALE_BENCH_BATCH"]), layout)
        env = {**env, "OUTBOX_CONFIG": str(config)}
    relays = Relays(layout, env, log_dir, tag)
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            launched = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            t0 = time.monotonic()
            relays.start()
            deadline = t0 + DRAIN_TIMEOUT_S
            while _unfinished(conn, layout.tables):
                if relays.check():
                    break  # every relay exited with rows left: reported below
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{layout.name}: not drained after {DRAIN_TIMEOUT_S:.0f} s")
                time.sleep(POLL_S)
            bench_s = time.monotonic() - t0
            relays.wait(60.0)
        finally:
            relays.stop()
        first, last, published, counts = _db_times(conn, layout.tables)
    reports = relays.reports()
    sent = sum(int(r["sent"]) for r in reports)
    if counts.get("sent", 0) != expected or sent != expected or published is None or first is None:
        raise RuntimeError(f"{layout.name}: table(s) hold {counts}, relays report {sent} sent, expected {expected}")
    return Measurement(
        launch_rate=expected / (published - launched).total_seconds(),
        busy_rate=expected / (published - first).total_seconds(),
        bench_clock_rate=expected / bench_s,
        first_connect_s=(first - launched).total_seconds(),
        last_connect_s=(last - launched).total_seconds(),
        drain_s=(published - launched).total_seconds(),
        sent_per_relay=sorted((int(r["sent"]) for r in reports), reverse=True),
    )


# -- the scenario ----------------------------------------------------------------


def _layouts() -> list[Layout]:
    one = [Layout(f"1 table, {k} relay{'s' if k > 1 else ''}", (ONE_TABLE,), k) for k in PROCESS_COUNTS]
    return [
        *one,
        Layout("4 tables, 1 relay each", FOUR_TABLES, 1),
        Layout("50 tables, 1 relay group", FIFTY_TABLES, 1, groups=1),
        Layout("50 tables, 4 relay groups", FIFTY_TABLES, 1, groups=4),
    ]


def _sizes(sizes: Sizes) -> tuple[int, int]:
    quick = sizes == Sizes.quick()
    messages = _options["messages"] or (QUICK_MESSAGES if quick else DEFAULT_MESSAGES)
    messages -= messages % (len(FOUR_TABLES) * len(FIFTY_TABLES))  # the multi-table layouts split them evenly
    return messages, _options["batch"] or DEFAULT_BATCH


def _prepare(url: str, batch: int) -> tuple[dict[str, str], Path]:
    from outbox_pipelines.core.storage import schema

    for table in (ONE_TABLE, *FOUR_TABLES, *FIFTY_TABLES):
        schema.create_table(url, table)
    log_dir = BENCH_DIR / ".runs" / f"scale-{time.strftime('%Y%m%dT%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    config = log_dir / "outbox.toml"
    write_config(config, batch)
    return {**_relay_env(url, config), "SCALE_BENCH_BATCH": str(batch)}, log_dir


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    messages, batch = _sizes(sizes)
    env, log_dir = _prepare(url, batch)
    rows = make_rows(messages, TOPIC, "scale")
    layouts = _layouts()
    results: dict[str, list[Measurement]] = {layout.name: [] for layout in layouts}
    log(f"  {messages:,} messages, batch {batch}, relay logs under {log_dir}")
    for round_index in range(runs):
        for layout in layouts:  # interleaved: every layout once per round
            tag = f"r{round_index + 1}-k{layout.processes}{'t' if len(layout.tables) > 1 else ''}{len(layout.tables)}"
            m = measure(url, layout, rows, env, log_dir, tag)
            results[layout.name].append(m)
            log(
                f"  scale {layout.name:24s} round {round_index + 1}/{runs}: {m.launch_rate:8,.0f} msg/s launch→sent, "
                f"{m.busy_rate:8,.0f} msg/s first connect→sent; connected after {m.first_connect_s:.2f}–"
                f"{m.last_connect_s:.2f} s; sent per relay {m.sent_per_relay}"
            )
    return ScenarioResult(
        figures=_figures(layouts, results, messages, batch),
        details=_details(layouts, results, messages, batch, runs, log_dir),
    )


def _figures(layouts: list[Layout], results: dict[str, list[Measurement]], messages: int, batch: int) -> list[Figure]:
    base = results[layouts[0].name]
    figures = []
    for kind, what in (("launch_rate", "launch → all sent"), ("busy_rate", "first relay connected → all sent")):
        for layout in layouts:
            size = f"{messages:,} msgs" if len(layout.tables) == 1 else f"{messages // len(layout.tables):,} msgs each"
            ours = [getattr(m, kind) for m in results[layout.name]]
            reference = [getattr(m, kind) for m in base] if layout is not layouts[0] else []
            figures.append(
                Figure(
                    "scale",
                    f"scale, {layout.name} ({layout.processes} CLI process{'es' if layout.processes > 1 else ''}, "
                    f"batch {batch}, {size}): {what}",
                    "msg/s",
                    ours,
                    reference,
                    "1 relay, same round" if reference else "",
                )
            )
    return figures


def _details(
    layouts: list[Layout], results: dict[str, list[Measurement]], messages: int, batch: int, runs: int, log_dir: Path
) -> dict[str, Any]:
    return {
        "messages": messages,
        "batch": batch,
        "runs": runs,
        "four_tables": "N/4 messages in each of 4 tables (the same total as the one-table layouts)",
        "fifty_tables": "N/50 messages in each of 50 tables, relayed by 1 or 4 relay groups (one process each)",
        "command": "outbox-pipelines relay --table <table> --once --quiet --json --worker-id <id>; for the 50-table "
        "layouts outbox-pipelines relay --group <group> --once --quiet --json",
        "destination": "handlers (scale_out:registry, a no-op handler), parallelism 1, competing mode, mark_sent",
        "logs": str(log_dir),
        "layouts": {
            layout.name: {
                "tables": list(layout.tables),
                "processes": layout.processes,
                "launch_rate": [round(m.launch_rate, 1) for m in results[layout.name]],
                "busy_rate": [round(m.busy_rate, 1) for m in results[layout.name]],
                "bench_clock_rate": [round(m.bench_clock_rate, 1) for m in results[layout.name]],
                "first_connect_s": [round(m.first_connect_s, 3) for m in results[layout.name]],
                "last_connect_s": [round(m.last_connect_s, 3) for m in results[layout.name]],
                "drain_s": [round(m.drain_s, 3) for m in results[layout.name]],
                "sent_per_relay": [m.sent_per_relay for m in results[layout.name]],
            }
            for layout in layouts
        },
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def detail_lines(details: dict[str, Any]) -> list[str]:
    """The notes below the results table (bench/run.py calls this when the scenario ran)."""
    lines = [
        f"- **scale**: {details['messages']:,} messages per measurement; each relay is a real process, "
        f"`{details['command']}`; destination {details['destination']}, batch {details['batch']}. The 4-table "
        "layout holds N/4 per table. *launch → all sent* counts process start-up (imports, connect) as a user "
        "starting relays for a backlog pays it; *first relay connected → all sent* is the rate of running relays. "
        "Database clock; rounds interleaved; the ratio is the speed-up over 1 relay in the same round.",
    ]
    for name, d in details["layouts"].items():
        with contextlib.suppress(IndexError):
            working = [sum(1 for n in sent if n) for sent in d["sent_per_relay"]]
            lines.append(
                f"  {name}: relays connected {_median(d['first_connect_s']):.2f}–{_median(d['last_connect_s']):.2f} s "
                f"after launch (medians), drained {_median(d['drain_s']):.2f} s after launch; relays that got work "
                f"{min(working)}–{max(working)} of {d['processes']}; sent per relay (last round) "
                f"{d['sent_per_relay'][-1]}; bench-clock launch → done {_median(d['bench_clock_rate']):,.0f} msg/s."
            )
    return lines
