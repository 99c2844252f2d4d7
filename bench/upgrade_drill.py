"""The upgrade drill (issue 41's proof): a version teams run today migrated to this working tree, online.

For each OLD version (a commit of this repository, checked out with ``git worktree add``), on a fresh database:

1. the OLD version's ``db upgrade`` makes its schema; 1,000,000 rows go into ``outbox_events`` (mostly sent,
   published within the default retention of 168 h, a few dead) and 1,000,000 into ``outbox_audit`` with
   ``generate_series``; then VACUUM ANALYZE (one template per old version, cloned for each run);
2. the OLD version's producers (real processes, PYTHONPATH = the old tree, ``Outbox.enqueue`` of one message per
   transaction, 150 transactions/s in all) and its relay (``outbox-pipelines relay --table outbox_events``, a
   handler that records each event id it is given) run;
3. a 5,000-message backlog (the old version's ``enqueue_many``) is drained by the old relay on the old schema;
   then 20 s of steady state; then THIS working tree's ``db upgrade`` (the new version: /work/main as it is now,
   uncommitted changes included), each migration timed; 20 s more; the same backlog on the new schema;
4. ``db upgrade --contract`` is tried while the old relay runs (it must refuse), the old relay is stopped, the new
   relay started (it must drain a backlog too), ``db upgrade --contract`` run again (it must pass);
5. the producers stop, everything is drained, and every row the producers committed is counted: sent once, and
   the handlers saw each event id once.

Variant ``held``: a transaction holds ``outbox_events`` (BEGIN; SELECT ... LIMIT 1; 60 s) from just before the
upgrade: the upgrade must wait or retry, and the writes must never queue behind it for longer than the bound.

Measured: each producer transaction's latency (start to commit) before, during and after the upgrade (targets
during: longest <= 1 s, p99 <= 100 ms), errors of the old producers and relay (0), exactly-once delivery, the old
relay's backlog drain rate on the new schema against the old (>= 0.8x), the new relay's drain, the contract. A
sampler reads pg_stat_activity and pg_locks every 100 ms: a producer that waited for a lock is reported with
the statement and the lock that held it. Medians over --runs go to bench/results.md (a section at the top) and
bench/results.json (under "earlier", scenario "upgrade-drill"); each run's raw figures and logs stay under
bench/.runs/upgrade-drill-<time>/.

    .venv/bin/python bench/upgrade_drill.py                          # both old versions, both variants, 3 runs
    .venv/bin/python bench/upgrade_drill.py --runs 1 --old 049a0ee --variant plain
    .venv/bin/python bench/upgrade_drill.py --rows 100000 --audit-rows 100000 --runs 1 --no-record   # a smoke run
"""

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BENCH = HERE.parent
REPO = BENCH.parent
OLD_VERSIONS = ("049a0ee", "9e9c13c")
TABLE = "outbox_events"
UPGRADE_APP = "outbox-pipelines db upgrade"  # the application_name of the new version's upgrade session
PRODUCER_APP, RELAY_APP, HOLDER_APP = "drill-producer", "drill-relay", "drill-holder"
TOPICS = ("drill.tick", "drill.backlog")
SCENARIO = "upgrade-drill"
TITLE = "# outbox_pipelines benchmark results"  # bench/run.py's; its sections go below it, newest first

HANDLERS = '''"""The drill's handlers: each records the event id it is given (one file per relay process)."""
import os
import threading

from outbox_pipelines import HandlerRegistry

registry = HandlerRegistry()
_lock = threading.Lock()
_seen = open(os.path.join(os.environ["OUTBOX_DRILL_SEEN_DIR"], f"seen-{os.getpid()}.txt"), "a", buffering=1)


def record(message):
    with _lock:
        _seen.write(message.event_id + "\\n")


for _topic in ("drill.tick", "drill.backlog"):
    registry.on(_topic)(record)
'''

TABLE_SECTION = f'[tables.{TABLE}]\ndestination = "handlers"\nhandlers = "drill_handlers:registry"\n'
TABLE_SECTION += 'mode = "single-active"\n'

SEED_OUTBOX = """
INSERT INTO outbox_events (event_id, topic, payload, payload_sha, headers, status, attempts, available_at,
                           last_error, last_error_code, created_at, updated_at, published_at)
SELECT 'seed-' || g, 'order.created',
       jsonb_build_object('order_id', 'ord-' || lpad(g::text, 9, '0'), 'customer_id', 'cus-' || (g %% 9973),
                          'amount_cents', 1000 + g %% 50000, 'currency', 'EUR',
                          'lines', jsonb_build_array(
                              jsonb_build_object('sku', 'sku-' || (g %% 311), 'qty', 1 + g %% 3)),
                          'note', 'seeded by the upgrade drill'),
       md5(g::text), jsonb_build_object('trace_id', md5('t' || g)),
       CASE WHEN g %% 200 = 0 THEN 'dead' ELSE 'sent' END, CASE WHEN g %% 200 = 0 THEN 8 ELSE 1 END, t,
       CASE WHEN g %% 200 = 0 THEN 'HTTP 422 from the destination' END,
       CASE WHEN g %% 200 = 0 THEN 'BAD_PAYLOAD' END,
       t, t + interval '40 ms', CASE WHEN g %% 200 <> 0 THEN t + interval '40 ms' END
FROM generate_series(1, %(rows)s) AS g
CROSS JOIN LATERAL (SELECT now() - interval '160 hours' + (g::float8 / %(rows)s) * interval '159 hours' AS t) AS at
"""

SEED_AUDIT = """
INSERT INTO outbox_audit (outbox_table, message_id, event_id, from_status, to_status, attempts, code, worker,
                          trace_id, detail, created_at)
SELECT 'outbox_events', g, 'seed-' || g, 'sending', 'sent', 1, 'outbox_sent', 'relay-seed', md5('t' || g),
       'ref=seed', now() - interval '160 hours' + (g::float8 / %(rows)s) * interval '159 hours'
FROM generate_series(1, %(rows)s) AS g
"""

ACTIVITY = """
SELECT extract(epoch FROM clock_timestamp())::float8 AS t, a.pid, a.application_name AS app, a.state,
       a.backend_type, a.wait_event_type, a.wait_event, extract(epoch FROM a.query_start)::float8 AS query_start,
       extract(epoch FROM a.backend_start)::float8 AS backend_start,
       left(regexp_replace(a.query, '\\s+', ' ', 'g'), 240) AS query, pg_blocking_pids(a.pid) AS blockers
FROM pg_stat_activity AS a
WHERE a.pid <> pg_backend_pid()
  AND (a.datname = current_database() AND a.backend_type = 'client backend' OR a.backend_type <> 'client backend')
"""

LOCKS = """
SELECT l.pid, l.mode, l.granted, l.locktype,
       CASE WHEN l.relation IS NOT NULL THEN coalesce(c.relname, l.relation::text)
            WHEN l.locktype = 'object' AND l.classid = 'pg_database'::regclass AND l.objid = 0
                THEN 'the NOTIFY queue (taken at the commit of a transaction that notified)'
            WHEN l.locktype = 'object' THEN 'object ' || l.classid::regclass || ' ' || l.objid
            ELSE l.locktype END AS target
FROM pg_locks AS l LEFT JOIN pg_class AS c ON c.oid = l.relation
WHERE l.pid = ANY(%(pids)s) AND (NOT l.granted OR l.locktype NOT IN ('virtualxid', 'transactionid'))
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the children: run with PYTHONPATH = the old tree, so they import only what every version has ---------------


def child_producer(url: str, rate: float, tag: str, out: str) -> None:
    """Enqueue one message per transaction at ``rate``/s until SIGTERM; one line per transaction in ``out``:
    wall-clock start, latency (start to commit), how late it started against its schedule, ok or the error."""
    import psycopg

    from outbox_pipelines import Message, Outbox

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    outbox = Outbox(TABLE)
    conn = psycopg.connect(url, application_name=PRODUCER_APP)
    committed, errors, samples, n = 0, 0, [], 0
    interval = 1.0 / rate
    due = time.monotonic()
    with open(out, "w", buffering=1 << 16) as lines:
        while not stop.is_set():
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            started, wall = time.monotonic(), time.time()
            lag, due = started - due, due + interval
            n += 1
            message = Message(topic="drill.tick", payload={"n": n, "producer": os.getpid()}, event_id=f"{tag}-{n}")
            try:
                with conn.transaction():
                    outbox.enqueue(conn, message)
                committed, outcome = committed + 1, "ok"
            except Exception as exc:  # every error counts: the drill's target is none
                errors, outcome = errors + 1, type(exc).__name__
                samples.append(f"{type(exc).__name__}: {exc}"[:300])
                if conn.closed or conn.broken:
                    conn = psycopg.connect(url, application_name=PRODUCER_APP)
            lines.write(f"{wall:.6f} {time.monotonic() - started:.6f} {lag:.6f} {outcome}\n")
    conn.close()
    print(json.dumps({"committed": committed, "errors": errors, "error_samples": samples[:10]}), flush=True)


def child_burst(url: str, count: int, tag: str) -> None:
    """One transaction of ``count`` messages (the old version's enqueue_many); prints the id range and the
    database's clock just after the commit."""
    import psycopg

    from outbox_pipelines import Message, Outbox

    messages = [Message(topic="drill.backlog", payload={"n": i}, event_id=f"{tag}-{i}") for i in range(count)]
    with psycopg.connect(url, application_name=PRODUCER_APP) as conn:
        with conn.transaction():
            results = Outbox(TABLE).enqueue_many(conn, messages)
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    ids = [r.id for r in results]
    print(json.dumps({"first_id": min(ids), "last_id": max(ids), "committed_at": row[0] if row else None}))


# -- processes ---------------------------------------------------------------------------------------------


@dataclass
class Tree:
    """A version of the package: its source tree, and the project directory its commands run in."""

    name: str  # "049a0ee", or "new"
    path: Path
    project: Path
    extra: dict[str, str] = field(default_factory=dict)  # --new-env: variables for this version's processes

    def env(self, url: str, run_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_", "PYTHON"))}
        env.update(
            PYTHONPATH=f"{self.path}{os.pathsep}{run_dir}",
            OUTBOX_DATABASE_URL=url,
            OUTBOX_CONFIG=str(self.project / "outbox.toml"),
            OUTBOX_DRILL_SEEN_DIR=str(run_dir),
            PYTHONUNBUFFERED="1",
        )
        return env | self.extra


class Process:
    """A child process of the drill, with its output in a log file; stopped by its pid."""

    def __init__(self, label: str, args: Sequence[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        self.label, self.log_path = label, log_path
        self._log = open(log_path, "w")  # closed in stop()
        self.popen = subprocess.Popen(
            list(args), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            self._log.write(line)
            self._log.flush()

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for _, line in self.lines) or text in self.log_path.read_text(errors="replace"):
                return True
            if self.popen.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def wait(self, timeout: float) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(5)
        return code

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to this pid, SIGKILL after ``timeout``; the exit code."""
        if self.popen.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._reader.join(5)
        self._log.close()
        return self.popen.returncode

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def cli(tree: Tree, *args: str) -> list[str]:
    return [sys.executable, "-m", "outbox_pipelines.cli", *args]


def run_cli(tree: Tree, url: str, run_dir: Path, label: str, *args: str, timeout: float = 900) -> Process:
    process = Process(label, cli(tree, *args), tree.env(url, run_dir), tree.project, run_dir / f"{label}.log")
    try:
        process.wait(timeout)
    finally:
        process.stop()
    return process


def child(tree: Tree, url: str, run_dir: Path, label: str, *args: str) -> Process:
    return Process(
        label,
        [sys.executable, str(HERE), "--child", *args],
        tree.env(url, run_dir),
        tree.project,
        run_dir / f"{label}.log",
    )


# -- the database ------------------------------------------------------------------------------------------


class Server:
    """The PostgreSQL server: --database-url's, or an embedded one this script starts (and stops)."""

    def __init__(self, url: str | None) -> None:
        from outbox_pipelines_tests.scratch import ScratchServer

        if url:
            self._server = ScratchServer(url)
        else:
            self._server = ScratchServer.from_env(
                "OUTBOX_BENCH_DATABASE_URL", "outbox-upgrade-drill-pg-", lambda d: log(f"embedded PostgreSQL in {d}")
            )
        self.admin_url = self._server.admin_url

    def url_for(self, database: str) -> str:
        from outbox_pipelines.core.storage import db

        return db.url_with_database(self.admin_url, database)

    def execute(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement.encode())

    def create(self, name: str, template: str | None = None) -> str:
        self.drop(name)
        self.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""))
        return self.url_for(name)

    def drop(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def facts(self) -> dict[str, Any]:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            shown = {
                name: conn.execute(f"SHOW {name}".encode()).fetchone()[0]  # type: ignore[index]
                for name in ("server_version", "shared_buffers", "synchronous_commit", "max_wal_size")
            }
        return {"server": "embedded" if self._server.embedded else "external", **shown}

    def keep_log(self, folder: Path) -> None:
        """The embedded server's log (its checkpoints among others) copied to ``folder``."""
        if self._server.data_dir is not None:
            for path in self._server.data_dir.rglob("log"):
                if path.is_file():
                    shutil.copy(path, folder / "postgresql.log")

    def stop(self) -> None:
        if self._server.embedded:
            log(f"embedded PostgreSQL stopped: {self._server.stop()}")


def scalar(url: str, query: str, params: dict[str, Any] | None = None) -> Any:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query.encode(), params).fetchone()
    return row[0] if row else None


def run_sql(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.encode())


def drain_backlog(old: Tree, url: str, run_dir: Path, label: str, count: int, tag: str) -> float:
    """``count`` messages in one transaction (the old version's enqueue_many); the seconds from its commit to the
    last of them sent, on the database's clock."""
    import psycopg

    burst = child(old, url, run_dir, f"burst-{label}", "burst", url, str(count), tag)
    burst.wait(300)
    burst.stop()
    line = next((text for _, text in burst.lines if text.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"the backlog of {label} was not written:\n{burst.output()[-3000:]}")
    written = json.loads(line)
    query = (
        "SELECT count(*) FILTER (WHERE status = 'sent') AS sent, "
        "extract(epoch FROM max(published_at))::float8 AS last FROM outbox_events "
        "WHERE id BETWEEN %(first_id)s AND %(last_id)s AND topic = 'drill.backlog'"
    )
    deadline = time.monotonic() + 600
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            sent, last = conn.execute(query.encode(), written).fetchone()  # type: ignore[misc]
            if sent >= count:
                return float(last - written["committed_at"])
            time.sleep(0.2)
    raise RuntimeError(f"the backlog of {label} was not drained in 600 s")


def paired_drain(server: "Server", template: str, old: Tree, new: Tree, s: "Settings", run_dir: Path) -> dict[str, Any]:
    """The old relay's drain on the two schemas side by side: two clones of the template, one upgraded by the new
    version, an old relay on each, their backlogs in turns (ABBA...), each after a VACUUM and a CHECKPOINT; so the
    ratio compares the schemas at the same moments, whatever else the machine does (bench/README: References)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "drill_handlers.py").write_text(HANDLERS)
    stamp = int(time.time())
    urls = {"old": server.create(f"pair_old_{stamp}", template), "new": server.create(f"pair_new_{stamp}", template)}
    relays: list[Process] = []
    try:
        upgraded = run_cli(new, urls["new"], run_dir, "pair-new-db-upgrade", "db", "upgrade")
        if upgraded.popen.returncode != 0:
            raise RuntimeError(f"the new version's db upgrade failed:\n{upgraded.output()[-3000:]}")
        for schema, url in urls.items():
            env = old.env(url, run_dir) | {"PGAPPNAME": RELAY_APP}
            relay = Process(f"pair-relay-{schema}", cli(old, "relay", "--table", TABLE), env, old.project,
                            run_dir / f"pair-relay-{schema}.log")  # fmt: skip
            relays.append(relay)
            if not relay.wait_for("relaying", 120):
                raise RuntimeError(f"the old relay did not start:\n{relay.output()[-3000:]}")
        seconds: dict[str, list[float]] = {"old": [], "new": []}
        for n in range(s.drains):
            for schema in ("old", "new") if n % 2 == 0 else ("new", "old"):
                run_sql(urls[schema], "VACUUM outbox_events", "CHECKPOINT")
                label = f"pair-{schema}-{n + 1}"
                seconds[schema].append(drain_backlog(old, urls[schema], run_dir, label, s.backlog, label))
    finally:
        for relay in relays:
            relay.stop()
        for name in (f"pair_old_{stamp}", f"pair_new_{stamp}"):
            server.drop(name)
    rates = {k: round(s.backlog / statistics.median(v)) for k, v in seconds.items()}
    return {"seconds": seconds, "per_s": rates, "ratio": round(rates["new"] / rates["old"], 2),
            "relay_errors": {r.label: error_lines(r.output()) for r in relays}}  # fmt: skip


def make_template(server: Server, old: Tree, name: str, rows: int, audit_rows: int, run_dir: Path) -> str:
    """A database the OLD version migrated, loaded with the rows of a table in production use."""
    import psycopg

    url = server.create(name)
    started = time.monotonic()
    upgraded = run_cli(old, url, run_dir, f"template-{old.name}-db-upgrade", "db", "upgrade")
    if upgraded.popen.returncode != 0:
        raise SystemExit(f"the old version's db upgrade failed:\n{upgraded.output()}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_OUTBOX.encode(), {"rows": rows})
        conn.execute(SEED_AUDIT.encode(), {"rows": audit_rows})
        conn.execute(b"VACUUM ANALYZE outbox_events")
        conn.execute(b"VACUUM ANALYZE outbox_audit")
        size = conn.execute(
            b"SELECT pg_size_pretty(pg_total_relation_size('outbox_events')), "
            b"pg_size_pretty(pg_total_relation_size('outbox_audit'))"
        ).fetchone()
    log(
        f"template {name}: {rows:,} rows ({size[0] if size else '?'} with indexes), {audit_rows:,} audit rows "
        f"({size[1] if size else '?'}), in {time.monotonic() - started:.0f} s"
    )
    return url


# -- the sampler -------------------------------------------------------------------------------------------


@dataclass
class Samples:
    """What the sampler saw: the sessions waiting for a lock (with the locks and who held them), the producers'
    statements that had run for over 100 ms (with what the server's background processes were doing), the
    upgrade session's statements, and when each migration's record appeared."""

    waits: list[dict[str, Any]] = field(default_factory=list)
    slow: list[dict[str, Any]] = field(default_factory=list)
    upgrade: list[dict[str, Any]] = field(default_factory=list)
    migrations: dict[str, float] = field(default_factory=dict)


BLOCKER_KEYS = ("pid", "app", "state", "wait_event_type", "wait_event", "query")


class Sampler(threading.Thread):
    def __init__(self, url: str, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.period, self.samples = url, period, Samples()
        self._halt = threading.Event()

    def run(self) -> None:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row, application_name="drill-sampler") as c:
            while not self._halt.wait(self.period):
                with suppress(psycopg.Error):
                    self._sample(c)

    def _sample(self, conn: Any) -> None:
        rows = conn.execute(ACTIVITY.encode()).fetchall()
        clients = [r for r in rows if r["backend_type"] == "client backend"]
        self.samples.upgrade += [r for r in clients if r["app"] == UPGRADE_APP and r["state"] == "active"]
        background = sorted(
            f"{r['backend_type']}: {r['wait_event_type']}/{r['wait_event']}"
            + (f" `{r['query'][:80]}`" if r["backend_type"].startswith("autovacuum worker") else "")
            for r in rows
            if r["backend_type"] != "client backend" and r["wait_event_type"] not in (None, "Activity")
        )
        for r in clients:
            if r["app"] == PRODUCER_APP and r["state"] == "active" and r["t"] - r["query_start"] > 0.1:
                self.samples.slow.append({**r, "background": background})
        waiting = [r for r in clients if r["wait_event_type"] == "Lock"]
        if waiting:
            self._waits(conn, waiting, {r["pid"]: r for r in clients})
        with suppress(Exception):
            for row in conn.execute(
                b"SELECT version, extract(epoch FROM clock_timestamp())::float8 AS t FROM outbox_schema_migrations"
            ).fetchall():
                self.samples.migrations.setdefault(row["version"], row["t"])

    def _waits(self, conn: Any, waiting: list[dict[str, Any]], by_pid: dict[int, dict[str, Any]]) -> None:
        pids = sorted({r["pid"] for r in waiting} | {b for r in waiting for b in r["blockers"]})
        locks = conn.execute(LOCKS.encode(), {"pids": pids}).fetchall()
        for r in waiting:
            wanted = [lk for lk in locks if lk["pid"] == r["pid"] and not lk["granted"]]
            targets = {lk["target"] for lk in wanted}
            blockers = []
            for b in r["blockers"]:
                theirs = [lk for lk in locks if lk["pid"] == b and lk["target"] in targets]
                blocker = {k: by_pid[b][k] for k in BLOCKER_KEYS} if b in by_pid else {"pid": b}
                blockers.append(
                    {
                        **blocker,
                        "holds": sorted({f"{lk['mode']} on {lk['target']}" for lk in theirs if lk["granted"]}),
                        "queued_for": sorted({f"{lk['mode']} on {lk['target']}" for lk in theirs if not lk["granted"]}),
                    }
                )
            wants = [f"{lk['mode']} on {lk['target']}" for lk in wanted]
            self.samples.waits.append({**r, "wants": wants, "blocked_by": blockers})

    def stop(self) -> Samples:
        self._halt.set()
        self.join(10)
        return self.samples


# -- figures -----------------------------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def read_transactions(paths: Sequence[Path]) -> list[tuple[float, float, float, str]]:
    found = []
    for path in paths:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                found.append((float(parts[0]), float(parts[1]), float(parts[2]), parts[3]))
    return sorted(found)


def window(transactions: list[tuple[float, float, float, str]], start: float, end: float) -> dict[str, Any]:
    """Latency figures of the transactions that started in [start, end): ms."""
    inside = [t for t in transactions if start <= t[0] < end]
    latencies = [t[1] * 1000 for t in inside]
    # From arrival: the transaction's due time (the producer's schedule) to its commit. A producer held up falls
    # behind its schedule, as requests arriving meanwhile would queue: what an open-loop client sees.
    arrivals = [(t[1] + max(t[2], 0.0)) * 1000 for t in inside]
    ends = sorted(t[0] + t[1] for t in inside if t[3] == "ok")
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {
        "seconds": round(end - start, 1),
        "transactions": len(inside),
        "errors": sum(1 for t in inside if t[3] != "ok"),
        "p50_ms": _round(quantile(latencies, 0.5)),
        "p99_ms": _round(quantile(latencies, 0.99)),
        "max_ms": _round(max(latencies, default=None)),
        "over_100ms": sum(1 for v in latencies if v > 100),
        "p99_from_arrival_ms": _round(quantile(arrivals, 0.99)),
        "max_from_arrival_ms": _round(max(arrivals, default=None)),
        "arrivals_over_100ms_pct": _round(100 * sum(1 for v in arrivals if v > 100) / len(arrivals), 2)
        if arrivals
        else None,
        "longest_gap_between_commits_ms": _round(max(gaps, default=0) * 1000),
        "worst_start_lag_ms": _round(max((t[2] * 1000 for t in inside), default=None)),
    }


def lag_window(lags: list[tuple[float, float]], start: float, end: float) -> dict[str, Any]:
    """Enqueue-to-sent figures (ms) of the producers' messages enqueued in [start, end)."""
    inside = [lag * 1000 for at, lag in lags if start <= at < end]
    return {"messages": len(inside), "p50_ms": _round(quantile(inside, 0.5)),
            "p99_ms": _round(quantile(inside, 0.99)), "max_ms": _round(max(inside, default=None))}  # fmt: skip


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def stalls(
    transactions: list[tuple[float, float, float, str]], samples: Samples, threshold_s: float
) -> list[dict[str, Any]]:
    """The longest producer transactions over ``threshold_s``, each with what the sampler saw meanwhile: the locks
    producers waited for and who held them (with its statement), else what the producers' statements waited on
    and what the server's background processes were doing; and the upgrade's statement at the time."""
    found: list[dict[str, Any]] = []
    for wall, latency, _, outcome in sorted(transactions, key=lambda t: -t[1]):
        if latency < threshold_s or len(found) == 6:
            break
        if any(f["at"] <= wall + latency and wall <= f["at"] + f["latency_ms"] / 1000 for f in found):
            continue  # the same stall, seen by another producer
        during = [w for w in samples.waits if w["app"] == PRODUCER_APP and wall <= w["t"] <= wall + latency]
        behind: dict[str, dict[str, Any]] = {}
        for w in during:
            for b in w["blocked_by"]:
                entry = behind.setdefault(
                    f"{b.get('app')}: {b.get('query')}",
                    {"wants": w["wants"], "blocker_app": b.get("app"), "blocker_holds": b.get("holds"),
                     "blocker_queued_for": b.get("queued_for"),
                     "blocker_waits": f"{b.get('wait_event_type')}/{b.get('wait_event')}",
                     "blocker_query": b.get("query"), "samples": 0},
                )  # fmt: skip
                entry["samples"] += 1
        held_up = {
            f"{b.get('app') or b['pid']} ({b.get('state')}, holding {', '.join(b.get('holds') or ['?'])})"
            for w in samples.waits
            if w["app"] == UPGRADE_APP and wall <= w["t"] <= wall + latency
            for b in w["blocked_by"]
        }
        slow = [x for x in samples.slow if wall <= x["t"] <= wall + latency]
        upgrade = {x["query"][:120] for x in samples.upgrade if wall <= x["t"] <= wall + latency}
        found.append(
            {
                "at": wall,
                "latency_ms": round(latency * 1000, 1),
                "outcome": outcome,
                "waited_behind": sorted(behind.values(), key=lambda e: -e["samples"]),
                "producer_waits": sorted({f"{x['wait_event_type']}/{x['wait_event']} in `{x['query'][:60]}`"
                                          for x in slow}),
                "background": sorted({b for x in slow for b in x["background"]}),
                "upgrade_running": sorted(upgrade),
                "upgrade_waited_behind": sorted(held_up),
            }
        )  # fmt: skip
    return found


def upgrade_statements(samples: Samples) -> list[dict[str, Any]]:
    """The upgrade session's statements as sampled: start (s after the first), how long, waiting on what."""
    by_start: dict[tuple[float, str], dict[str, Any]] = {}
    for s in samples.upgrade:
        key = (s["query_start"], s["query"])
        entry = by_start.setdefault(key, {"start": s["query_start"], "last": s["t"], "query": s["query"], "waits": {}})
        entry["last"] = s["t"]
        if s["wait_event_type"]:
            label = f"{s['wait_event_type']}/{s['wait_event']}"
            entry["waits"][label] = entry["waits"].get(label, 0) + 1
    ordered = sorted(by_start.values(), key=lambda e: e["start"])
    return [
        {
            "start": e["start"],
            "seconds": round(e["last"] - e["start"], 2),
            "query": e["query"][:160],
            "waited": {k: f"~{v / 10:.1f} s" for k, v in e["waits"].items()},
        }
        for e in ordered
    ]


def migration_times(samples: Samples, started: float, before: set[str]) -> dict[str, float]:
    """Each migration the upgrade applied, with the seconds from the previous one's record (the first: from the
    upgrade session's start, else ``started``) to its own (the contract steps are timed apart)."""
    new = sorted((at, v) for v, at in samples.migrations.items() if v not in before and not v.startswith("contract/"))
    sessions = [x["backend_start"] for x in samples.upgrade if x["backend_start"] and x["backend_start"] >= started]
    times, previous = {}, min(sessions, default=started)
    for at, version in new:
        times[version] = round(at - previous, 2)
        previous = at
    return times


# -- one run -----------------------------------------------------------------------------------------------


@dataclass
class Settings:
    rows: int
    audit_rows: int
    rate: float
    producers: int
    steady: float
    after: float
    hold: float
    backlog: int
    drains: int


class Run:
    """One drill: an old version's producers and relay, the new version's upgrade, and what they did."""

    def __init__(self, server: Server, template: str, old: Tree, new: Tree, variant: str, s: Settings, d: Path):
        self.server, self.old, self.new, self.variant, self.s, self.dir = server, old, new, variant, s, d
        self.name = f"drill_{old.name}_{variant}_{int(time.time())}"
        self.url = server.create(self.name, template)
        self.processes: list[Process] = []
        from obench.code_version import measured_code

        commit, dirty = measured_code(["outbox_pipelines", "sql"])  # the tree is edited while the drill runs
        self.result: dict[str, Any] = {"old": old.name, "variant": variant, "new": commit + ("+" if dirty else "")}
        self.tag = f"{old.name}-{variant}-{os.getpid()}"
        self.backlog_messages = 0

    def start(self, process: Process) -> Process:
        self.processes.append(process)
        return process

    def relay(self, tree: Tree, label: str) -> Process:
        env = tree.env(self.url, self.dir) | {"PGAPPNAME": RELAY_APP}
        process = Process(label, cli(tree, "relay", "--table", TABLE), env, tree.project, self.dir / f"{label}.log")
        self.start(process)
        if not process.wait_for("relaying", 120):
            raise RuntimeError(f"{label} did not start:\n{process.output()[-3000:]}")
        return process

    def backlog(self, label: str) -> dict[str, Any]:
        """``times`` backlogs of ``backlog`` messages, one after the other, each in one transaction (the old
        version's enqueue_many) after a VACUUM and a CHECKPOINT of the table (so that each schema's drain starts
        from the same table state, as bench/run.py's do), each timed from its commit to its last message sent
        on the database's clock: the median rate (the machine is shared; one drain in a few is slowed)."""
        seconds, times = [], self.s.drains
        for n in range(times):
            run_sql(self.url, "VACUUM outbox_events", "CHECKPOINT")
            seconds.append(self._one_backlog(f"{label}-{n + 1}"))
        self.backlog_messages += times * self.s.backlog
        return {
            "messages": self.s.backlog,
            "seconds": [round(v, 3) for v in seconds],
            "per_s": round(self.s.backlog / statistics.median(seconds)),
        }

    def _one_backlog(self, label: str) -> float:
        return drain_backlog(self.old, self.url, self.dir, label, self.s.backlog, f"{self.tag}-{label}")

    def execute(self) -> dict[str, Any]:
        sampler = Sampler(self.url)
        sampler.start()
        try:
            self._phases(sampler)
        finally:
            for process in reversed(self.processes):
                process.stop()
            samples = sampler.stop()
        self._figures(samples)
        (self.dir / "samples.json").write_text(json.dumps(samples.__dict__, default=str))  # for a closer look
        return self.result

    def _phases(self, sampler: Sampler) -> None:
        s, r, marks = self.s, self.result, {}
        old_relay = self.relay(self.old, "old-relay")
        per = s.rate / s.producers
        self.producers = [
            self.start(
                child(
                    self.old,
                    self.url,
                    self.dir,
                    f"producer-{i}",
                    "producer",
                    self.url,
                    f"{per}",
                    f"{self.tag}-p{i}",
                    str(self.dir / f"producer-{i}.txt"),
                )
            )
            for i in range(s.producers)
        ]
        time.sleep(5)
        r["backlog_old_relay_old_schema"] = self.backlog("old-schema")
        log(f"  old relay, old schema: {r['backlog_old_relay_old_schema']}")
        marks["before"] = time.time()
        time.sleep(s.steady)
        applied_before = set(sampler.samples.migrations)
        holder = Holder(self.url, s.hold) if self.variant == "held" else None
        marks["upgrade_start"] = time.time()
        upgrade = run_cli(self.new, self.url, self.dir, "new-db-upgrade", "db", "upgrade")
        marks["upgrade_end"] = time.time()
        r["upgrade"] = {
            "exit": upgrade.popen.returncode,
            "seconds": round(marks["upgrade_end"] - marks["upgrade_start"], 2),
            "output": upgrade.output().splitlines()[:80],
        }
        r["holder"] = holder.finish() if holder else None
        log(f"  new db upgrade: exit {upgrade.popen.returncode} in {r['upgrade']['seconds']} s")
        self._applied_before, marks["after_end"] = applied_before, time.time() + s.after
        time.sleep(s.after)
        r["backlog_old_relay_new_schema"] = self.backlog("new-schema")
        log(f"  old relay, new schema: {r['backlog_old_relay_new_schema']}")
        early = run_cli(self.new, self.url, self.dir, "contract-early", "db", "upgrade", "--contract")
        r["contract_while_old_relay_runs"] = {"exit": early.popen.returncode, "said": early.output()[-600:]}
        r["old_relay_exit"] = old_relay.stop()
        self.relay(self.new, "new-relay")
        r["backlog_new_relay"] = self.backlog("new-relay")
        log(f"  new relay: {r['backlog_new_relay']}")
        marks["contract_start"] = time.time()
        r["contract"] = self._contract()
        marks["contract_end"] = time.time()
        time.sleep(2)
        r["producers"] = [self._stop_producer(p) for p in self.producers]
        marks["end"] = time.time()
        r["drained_s"] = self._drain()
        self.marks = marks
        r["marks"] = marks

    def _contract(self) -> dict[str, Any]:
        """``db upgrade --contract`` once the old relay stopped; tried again for 3 minutes while refused (an old
        relay that stopped without saying so counts as running until its heartbeat is 2 minutes old)."""
        started = time.monotonic()
        tries = 0
        while True:
            tries += 1
            done = run_cli(self.new, self.url, self.dir, f"contract-{tries}", "db", "upgrade", "--contract")
            if done.popen.returncode == 0 or time.monotonic() - started > 180:
                break
            time.sleep(5)
        return {
            "exit": done.popen.returncode,
            "tries": tries,
            "seconds": round(time.monotonic() - started, 1),
            "said": done.output()[-600:],
        }

    def _stop_producer(self, process: Process) -> dict[str, Any]:
        process.stop()
        line = next((text for _, text in reversed(process.lines) if text.startswith("{")), None)
        return json.loads(line) if line else {"committed": None, "errors": None, "said": process.output()[-2000:]}

    def _drain(self) -> float:
        started = time.monotonic()
        while time.monotonic() - started < 300:
            left = scalar(self.url, "SELECT count(*) FROM outbox_events WHERE status IN ('pending', 'sending')")
            if left == 0:
                return round(time.monotonic() - started, 1)
            time.sleep(0.5)
        return -1.0

    def _figures(self, samples: Samples) -> None:
        r, m = self.result, getattr(self, "marks", None)
        transactions = read_transactions(sorted(self.dir.glob("producer-*.txt")))
        if m is None:
            return
        r["windows"] = {
            "before": window(transactions, m["before"], m["upgrade_start"]),
            "during": window(transactions, m["upgrade_start"], m["upgrade_end"]),
            "after": window(transactions, m["upgrade_end"], m["after_end"]),
            "contract": window(transactions, m["contract_start"], m["contract_end"]),
            "whole": window(transactions, 0, float("inf")),
        }
        r["migrations_s"] = migration_times(samples, m["upgrade_start"], self._applied_before)
        statements = upgrade_statements(samples)
        base = m["upgrade_start"]
        r["upgrade_statements"] = [{**st, "start": round(st["start"] - base, 2)} for st in statements]
        r["stalls"] = stalls(transactions, samples, 0.1)
        phases = [
            ("before", m["before"]),
            ("during", m["upgrade_start"]),
            ("after", m["upgrade_end"]),
            ("later", m["after_end"]),
            ("contract", m["contract_start"]),
            ("later", m["contract_end"]),
        ]
        for st in r["stalls"]:
            st["phase"] = next((name for name, at in reversed(phases) if st["at"] >= at), "warm-up")
            st["at"] = round(st["at"] - base, 2)
        r["lock_waits_of_producers"] = sum(1 for w in samples.waits if w["app"] == PRODUCER_APP)
        r["delivery"] = self._delivery()
        lags = self._lags()
        r["delivery_lag"] = {
            "before": lag_window(lags, m["before"], m["upgrade_start"]),
            "during": lag_window(lags, m["upgrade_start"], m["upgrade_end"]),
            "after": lag_window(lags, m["upgrade_end"], m["after_end"]),
        }
        r["relay_errors"] = {p.label: error_lines(p.output()) for p in self.processes if "relay" in p.label}

    def _lags(self) -> list[tuple[float, float]]:
        """Each producer message: when it was enqueued, and the seconds until its relay marked it sent."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                b"SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM published_at - created_at)::float8 "
                b"FROM outbox_events WHERE topic = 'drill.tick' AND published_at IS NOT NULL"
            ).fetchall()
        return [(float(a), float(b)) for a, b in rows]

    def _delivery(self) -> dict[str, Any]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            by_status = dict(
                conn.execute(  # type: ignore[arg-type]
                    b"SELECT status, count(*) FROM outbox_events WHERE topic = ANY(%s) GROUP BY status", (list(TOPICS),)
                ).fetchall()
            )
            retried = scalar(self.url, "SELECT count(*) FROM outbox_events WHERE topic LIKE 'drill.%' AND attempts > 1")
            invalid = conn.execute(
                b"SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE NOT i.indisvalid"
            ).fetchall()
            indexes = [
                row[0]
                for row in conn.execute(
                    b"SELECT indexname FROM pg_indexes WHERE tablename = 'outbox_events' ORDER BY 1"
                ).fetchall()
            ]
        seen = [line for p in self.dir.glob("seen-*.txt") for line in p.read_text().splitlines() if line]
        committed = sum(p.get("committed") or 0 for p in self.result.get("producers", []))
        committed += self.backlog_messages
        return {
            "rows_by_status": by_status,
            "committed_by_producers_and_backlogs": committed,
            "retried": retried,
            "handler_calls": len(seen),
            "distinct_event_ids_seen": len(set(seen)),
            "duplicates_seen": len(seen) - len(set(seen)),
            "exactly_once": by_status.get("sent", 0) == committed == len(seen) == len(set(seen))
            and set(by_status) <= {"sent"},
            "invalid_indexes": [row[0] for row in invalid],
            "indexes_after": indexes,
        }


def error_lines(text: str) -> list[str]:
    words = ("Traceback", "error", "Error", "refused", "failed", "exception")
    return [line[:300] for line in text.splitlines() if any(w in line for w in words)][:20]


class Holder:
    """A transaction that holds the table (BEGIN; SELECT ... LIMIT 1) for ``seconds``, as a report or a business
    transaction waiting on a slow API would; started just before the upgrade."""

    def __init__(self, url: str, seconds: float) -> None:
        import psycopg

        self.seconds = seconds
        self.conn = psycopg.connect(url, application_name=HOLDER_APP)
        self.conn.execute(b"SELECT id FROM outbox_events LIMIT 1").fetchone()
        self.started = time.time()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        time.sleep(0.5)

    def _hold(self) -> None:
        time.sleep(self.seconds)
        self.conn.rollback()
        self.ended = time.time()

    def finish(self) -> dict[str, Any]:
        self.thread.join()
        self.conn.close()
        return {"held_s": self.seconds, "upgrade_started_after_s": 0.5}


# -- the whole drill ---------------------------------------------------------------------------------------


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    path = Path(f"/tmp/old-{commit}")
    created = not path.exists()
    if created:
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), commit], cwd=REPO, check=True, capture_output=True
        )
    try:
        yield path
    finally:
        if created:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)


def project(root: Path, name: str) -> Path:
    """The team's project as one version of the package runs it: a folder per version, one project name for both (a
    table belongs to its project, migration 0013: the new version's upgrade of another name would be refused)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text('[project]\nname = "drill-team"\nversion = "1"\n')
    (folder / "outbox.toml").write_text(TABLE_SECTION)
    return folder


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per old version and variant: each figure's median, min and max over the runs."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(f"{run['old']} {run['variant']}", []).append(run)
    return {
        key: {
            name: _stats([f for f in (pick(r) for r in rs) if f is not None]) for name, (pick, _, _) in FIGURES.items()
        }
        for key, rs in groups.items()
    }


def _stats(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def _ratio(run: dict[str, Any]) -> float | None:
    before, after = run.get("backlog_old_relay_old_schema"), run.get("backlog_old_relay_new_schema")
    return round(after["per_s"] / before["per_s"], 2) if before and after else None


def _get(*path: str) -> Any:
    def pick(run: dict[str, Any]) -> Any:
        value: Any = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return pick


def _errors(run: dict[str, Any]) -> float:
    producer = sum(p.get("errors") or 0 for p in run.get("producers", []))
    relays = {**run.get("relay_errors", {}), **run.get("paired_drain", {}).get("relay_errors", {})}
    return producer + sum(len(lines) for lines in relays.values())


def _once(run: dict[str, Any]) -> float:
    d = run.get("delivery", {})
    return (
        0.0
        if d.get("exactly_once")
        else float(
            max(1, abs(d.get("committed_by_producers_and_backlogs", 0) - d.get("rows_by_status", {}).get("sent", 0)))
        )
    )


# name -> (how to read it from a run, unit, target (text, test))
FIGURES: dict[str, tuple[Any, str, tuple[str, Any] | None]] = {
    "longest producer transaction during the upgrade": (
        _get("windows", "during", "max_ms"),
        "ms",
        ("≤ 1000 ms", lambda v: v <= 1000),
    ),
    "p99 during the upgrade": (_get("windows", "during", "p99_ms"), "ms", ("≤ 100 ms (plain)", lambda v: v <= 100)),
    "p99 from arrival during the upgrade (open loop)": (_get("windows", "during", "p99_from_arrival_ms"), "ms", None),
    "longest from arrival during the upgrade": (_get("windows", "during", "max_from_arrival_ms"), "ms", None),
    "arrivals that waited over 100 ms during the upgrade": (
        _get("windows", "during", "arrivals_over_100ms_pct"),
        "%",
        None,
    ),
    "p50 during the upgrade": (_get("windows", "during", "p50_ms"), "ms", None),
    "p99 before": (_get("windows", "before", "p99_ms"), "ms", None),
    "p50 before": (_get("windows", "before", "p50_ms"), "ms", None),
    "longest before": (_get("windows", "before", "max_ms"), "ms", None),
    "p99 after": (_get("windows", "after", "p99_ms"), "ms", None),
    "p50 after": (_get("windows", "after", "p50_ms"), "ms", None),
    "longest after": (_get("windows", "after", "max_ms"), "ms", None),
    "delivery lag (enqueue to sent) p99 before": (_get("delivery_lag", "before", "p99_ms"), "ms", None),
    "delivery lag p99 during the upgrade": (_get("delivery_lag", "during", "p99_ms"), "ms", None),
    "delivery lag max during the upgrade": (_get("delivery_lag", "during", "max_ms"), "ms", None),
    "longest during the contract step": (
        _get("windows", "contract", "max_ms"),
        "ms",
        ("≤ 1000 ms", lambda v: v <= 1000),
    ),
    "errors, old producers and old relay": (_errors, "", ("0", lambda v: v == 0)),
    "messages not delivered exactly once": (_once, "", ("0", lambda v: v == 0)),
    "db upgrade (new version), whole": (_get("upgrade", "seconds"), "s", None),
    "old relay, 5,000 backlog, old schema": (_get("backlog_old_relay_old_schema", "per_s"), "msg/s", None),
    "old relay, 5,000 backlog, new schema": (_get("backlog_old_relay_new_schema", "per_s"), "msg/s", None),
    "old relay drain, new / old schema": (_ratio, "×", ("≥ 0.8× (median)", lambda v: v >= 0.8)),
    "old relay, same time, two databases, new / old schema": (
        _get("paired_drain", "ratio"),
        "×",
        ("≥ 0.8× (median)", lambda v: v >= 0.8),
    ),
    "new relay, 5,000 backlog": (_get("backlog_new_relay", "per_s"), "msg/s", ("drains", lambda v: v > 0)),
    "contract refused while the old relay runs (exit code)": (
        _get("contract_while_old_relay_runs", "exit"),
        "",
        ("≠ 0", lambda v: v != 0),
    ),
    "contract after the old relay stopped (exit code)": (_get("contract", "exit"), "", ("0", lambda v: v == 0)),
}


JSON_INFO = {
    "p99 from arrival during the upgrade (open loop)",
    "p99 before",
    "db upgrade (new version), whole",
    "old relay, 5,000 backlog, old schema",
    "old relay, 5,000 backlog, new schema",
}


def target_of(group: str, target: tuple[str, Any] | None) -> tuple[str, Any] | None:
    """The target a figure has in ``group`` ("<old> <variant>"): one marked "(plain)" is the drill's target for the
    plain variant; the held variant's target is the bound on the longest transaction (issue 41)."""
    if target and "(plain)" in target[0] and not group.endswith("plain"):
        return None
    return target


def met(target: tuple[str, Any], stats: dict[str, Any]) -> bool:
    """A target marked "(median)" holds for the median over the runs (a rate on a shared machine); any other for
    every run (a bound on a stall, errors, the delivery)."""
    if target[0].endswith("(median)"):
        return bool(target[1](stats["median"]))
    return all(target[1](v) for v in stats["runs"])


def render(report: dict[str, Any]) -> str:
    lines = [
        f"## Run of {report['timestamp']}: {SCENARIO} (commit {report['git_commit']}"
        f"{' + uncommitted changes' if report['dirty'] else ''}, written by bench/upgrade_drill.py)",
        "",
        f"Generated {report['timestamp']} by `{report['command']}` in {report['minutes']:.0f} min. Each old version "
        f"(a commit of this repository) migrated by the working tree at {report['git_commit']}"
        f"{' with its uncommitted changes' if report['dirty'] else ''}, on a database with "
        f"{report['settings']['rows']:,} rows in `outbox_events` and {report['settings']['audit_rows']:,} audit "
        f"rows, while the old version's producers ({report['settings']['producers']} processes, "
        f"{report['settings']['rate']:g} transactions/s in all, one `Outbox.enqueue` each) and its relay ran. "
        f"*held*: a transaction holds `outbox_events` for {report['settings']['hold']:g} s from just before the "
        "upgrade. Median over the runs [min–max]; a target holds in every run unless marked (median).",
        "",
        f"- Machine: {report['machine']}; load average {report['load'][0]} at start, {report['load'][1]} at end",
        f"- PostgreSQL {report['postgres'].get('server_version')} ({report['postgres'].get('server')}), "
        f"shared_buffers {report['postgres'].get('shared_buffers')}",
        "",
    ]
    for key, figures in summarise(report["runs"]).items():
        lines += [f"### {key}", "", "| figure | median [min–max] | target | result |", "|---|---|---|---|"]
        for name, (_, unit, declared) in FIGURES.items():
            stats, target = figures.get(name), target_of(key, declared)
            if stats is None:
                lines.append(f"| {name} | – | {target[0] if target else '–'} | – |")
                continue
            cell = f"{_fmt(stats['median'])} [{_fmt(stats['min'])}–{_fmt(stats['max'])}] {unit}".rstrip()
            verdict = "info"
            if target:
                verdict = "**pass**" if met(target, stats) else "**MISS**"
            lines.append(f"| {name} | {cell} | {target[0] if target else '–'} | {verdict} |")
        lines.append("")
    lines += details(report["runs"])
    return "\n".join(lines) + "\n"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def details(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["### Details (per run)", ""]
    for i, run in enumerate(runs, 1):
        migrations = ", ".join(f"{v} {s:.1f} s" for v, s in run.get("migrations_s", {}).items())
        lines.append(
            f"- run {i}, {run['old']} {run['variant']} (new tree at {run.get('new')}): migrations applied (each "
            f"from the previous one's record, the first from the upgrade session's start): {migrations or 'none'}"
        )
        slow = sorted(run.get("upgrade_statements", []), key=lambda st: -st["seconds"])[:3]
        lines.append(
            "  longest upgrade statements: "
            + "; ".join(
                f"{st['seconds']:.1f} s at +{st['start']:.1f} s `{st['query'][:110]}`"
                + (f" (waited {st['waited']})" if st["waited"] else "")
                for st in slow
            )
        )
        lines += [stall_line(st) for st in run.get("stalls", [])[:3]]
        d, contract = run.get("delivery", {}), run.get("contract", {})
        relay_errors = {k: len(v) for k, v in run.get("relay_errors", {}).items()}
        lines.append(
            f"  delivery: {d.get('rows_by_status')} of {d.get('committed_by_producers_and_backlogs')} committed, "
            f"handler calls {d.get('handler_calls')}, duplicates {d.get('duplicates_seen')}, retried "
            f"{d.get('retried')}, INVALID indexes {d.get('invalid_indexes')}; contract {contract.get('tries')} "
            f"tries, {contract.get('seconds')} s; relay error lines {relay_errors}; the upgrade said it waited for a "
            f"lock {sum('not granted' in line for line in run.get('upgrade', {}).get('output', []))} times"
        )
    return lines


def stall_line(st: dict[str, Any]) -> str:
    """One slow producer transaction, for people: what it waited behind, or what was going on."""
    said = f"  {st.get('phase', '')}: producer transaction of {st['latency_ms']:.0f} ms at {st['at']:+.1f} s: "
    if st["waited_behind"]:
        said += "; ".join(
            f"wanted {', '.join(w['wants'])} behind {w['blocker_app']} ("
            + (f"holding {', '.join(w['blocker_holds'])}" if w["blocker_holds"] else "")
            + (f"queued ahead for {', '.join(w['blocker_queued_for'])}" if w.get("blocker_queued_for") else "")
            + f"; itself waiting on {w['blocker_waits']}): `{(w['blocker_query'] or '')[:120]}` "
            f"(sampled {w['samples']}×)"
            for w in st["waited_behind"][:2]
        )
    else:
        said += "no lock wait sampled"
    if st["producer_waits"]:
        said += f"; producers waited on {', '.join(st['producer_waits'][:3])}"
    if st["background"]:
        said += f"; meanwhile {', '.join(st['background'][:4])}"
    if st["upgrade_running"]:
        said += f"; the upgrade ran `{st['upgrade_running'][0][:100]}`"
    if st.get("upgrade_waited_behind"):
        said += f", waiting behind {', '.join(st['upgrade_waited_behind'][:2])}"
    return said


def record(report: dict[str, Any], out_dir: Path) -> None:
    """A section at the top of results.md (below the title) and the figures under results.json's "earlier"."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "results.md"
    existing = md.read_text() if md.exists() else TITLE + "\n"
    body = existing[len(TITLE) :].lstrip() if existing.startswith(TITLE) else existing
    md.write_text(f"{TITLE}\n\n{render(report)}\n{body}")
    path = out_dir / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    figures = []
    for key, stats_by_name in summarise(report["runs"]).items():
        for name, (_, unit, declared) in FIGURES.items():
            stats, target = stats_by_name.get(name), target_of(key, declared)
            if stats is None or not (declared or name in JSON_INFO):
                continue  # results.md has every figure; results.json the targets and a few for comparison
            figures.append(
                {
                    "scenario": SCENARIO,
                    "label": f"{key}: {name}",
                    "unit": unit,
                    "ours": stats,
                    "ceiling": None,
                    "ceiling_label": None,
                    "ratio": None,
                    "target": target[0] if target else None,
                    "pass": None if stats is None or not target else met(target, stats),
                    "note": None,
                }
            )
    results.setdefault("earlier", {})[SCENARIO] = {
        "timestamp": report["timestamp"],
        "command": report["command"],
        "runs": report["settings"]["runs"],
        "git_commit": report["git_commit"],
        "figures": figures,
        "details": {SCENARIO: {"settings": report["settings"], "postgres": report["postgres"]}},
    }
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/upgrade_drill.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--old", action="append", help=f"old version (commit); default: {', '.join(OLD_VERSIONS)}")
    parser.add_argument("--variant", action="append", choices=("plain", "held"), help="default: both")
    parser.add_argument("--runs", type=int, default=3, help="runs per old version and variant (default 3)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in outbox_events (default 1,000,000)")
    parser.add_argument("--audit-rows", type=int, default=1_000_000, help="rows in outbox_audit (default 1,000,000)")
    parser.add_argument("--rate", type=float, default=150.0, help="producer transactions/s in all (default 150)")
    parser.add_argument("--producers", type=int, default=3, help="producer processes sharing the rate (default 3)")
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of steady state before the upgrade")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of producing after the upgrade")
    parser.add_argument("--hold", type=float, default=60.0, help="seconds the 'held' variant's transaction lasts")
    parser.add_argument("--backlog", type=int, default=5000, help="messages of each drained backlog (default 5,000)")
    parser.add_argument("--drains", type=int, default=5, help="backlogs drained per measurement, median (default 5)")
    parser.add_argument(
        "--database-url",
        help="an existing server (a database is created on it per run); default: "
        "OUTBOX_BENCH_DATABASE_URL, else an embedded PostgreSQL this script starts and stops",
    )
    parser.add_argument("--output", type=Path, default=BENCH, help="where results.md/json are (default bench/)")
    parser.add_argument("--no-record", action="store_true", help="print the section; write no results.md/json")
    parser.add_argument(
        "--new-env",
        action="append",
        metavar="NAME=VALUE",
        help="an environment variable for the new version's commands (e.g. OUTBOX_AUTOVACUUM=off)",
    )
    parser.add_argument("--only-paired", action="store_true", help="only the side-by-side drains (no drill)")
    parser.add_argument("--from-report", type=Path, help="record a finished run's report.json (bench/.runs/...) "
                        "in results.md/json instead of running")  # fmt: skip
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.child:  # stopped by a signal, the drill still stops its processes and its server (finally:)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        if kind == "producer":
            child_producer(rest[0], float(rest[1]), rest[2], rest[3])
        else:
            child_burst(rest[0], int(rest[1]), rest[2])
        return 0
    if args.from_report:
        record(json.loads(args.from_report.read_text()), args.output)
        log(f"{args.from_report} written to {args.output / 'results.md'} and results.json")
        return 0
    sys.path.insert(0, str(REPO))
    from obench.code_version import measured_code

    commit, dirty = measured_code(["outbox_pipelines", "sql"])
    settings = Settings(
        args.rows,
        args.audit_rows,
        args.rate,
        args.producers,
        args.steady,
        args.after,
        args.hold,
        args.backlog,
        args.drains,
    )
    started, load = time.time(), os.getloadavg()[0]
    runs_dir = BENCH / ".runs" / f"upgrade-drill-{time.strftime('%Y%m%dT%H%M%S')}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    # the template's db upgrade runs there: since e190491 it refuses a table whose handlers module it cannot import
    (runs_dir / "drill_handlers.py").write_text(HANDLERS)
    work = Path(tempfile.mkdtemp(prefix="outbox-upgrade-drill-"))
    (work / "drill_handlers.py").write_text(HANDLERS)
    server = Server(args.database_url)
    runs: list[dict[str, Any]] = []
    try:
        postgres = server.facts()
        for commit_old in args.old or OLD_VERSIONS:
            with worktree(commit_old) as old_path:
                old = Tree(commit_old, old_path, project(work, f"old-{commit_old}"))
                new = Tree("new", REPO, project(work, "new"), dict(v.split("=", 1) for v in args.new_env or []))
                template = f"drill_template_{commit_old}"
                make_template(server, old, template, args.rows, args.audit_rows, runs_dir)
                for n in range(args.runs):
                    log(f"{commit_old}: the old relay's drain on both schemas side by side, run {n + 1}")
                    paired = paired_drain(server, template, old, new, settings, runs_dir / f"{commit_old}-pair-{n + 1}")
                    log(f"  {paired['per_s']}: new / old {paired['ratio']}")
                    if args.only_paired:
                        runs.append({"old": commit_old, "variant": "paired", "paired_drain": paired})
                    for variant in [] if args.only_paired else args.variant or ("plain", "held"):
                        run_dir = runs_dir / f"{commit_old}-{variant}-{n + 1}"
                        run_dir.mkdir()
                        shutil.copy(work / "drill_handlers.py", run_dir)
                        log(f"{commit_old} {variant}, run {n + 1} of {args.runs}")
                        run = Run(server, template, old, new, variant, settings, run_dir)
                        try:
                            result = run.execute()
                        finally:
                            server.drop(run.name)
                        (run_dir / "result.json").write_text(json.dumps(result, indent=2, default=str))
                        if variant == (args.variant or ["plain"])[0]:  # measured once per run
                            result["paired_drain"] = paired
                        runs.append(result)
                        w = result.get("windows", {}).get("during", {})
                        log(
                            f"  during: p50 {w.get('p50_ms')} ms, p99 {w.get('p99_ms')} ms, max {w.get('max_ms')} "
                            f"ms; once: {result.get('delivery', {}).get('exactly_once')}"
                        )
                server.drop(template)
    finally:
        server.keep_log(runs_dir)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)),
        "command": "python bench/upgrade_drill.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": commit,
        "dirty": dirty,
        "minutes": (time.time() - started) / 60,
        "settings": {**settings.__dict__, "runs": args.runs},
        "machine": machine(),
        "load": (round(load, 2), round(os.getloadavg()[0], 2)),
        "postgres": postgres,
        "summary": summarise(runs),
        "runs": runs,
    }
    (runs_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    section = render(report)
    print(section)
    if not args.no_record:
        record(report, args.output)
        log(f"written to {args.output / 'results.md'} and results.json; raw runs in {runs_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
