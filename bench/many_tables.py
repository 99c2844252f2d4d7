"""Many tables under `outbox-pipelines dev`, for any checkout: how many of N module tables drain, how fast, and at
what memory cost (issue 23's measurement, run against the code before and after relay groups).

    .venv/bin/python bench/many_tables.py CHECKOUT TABLES [SECONDS]

CHECKOUT is a source tree of outbox_pipelines (this repository, or e.g. ``git worktree add /tmp/old 049a0ee``):
``dev`` and its Dagster processes run that code (PYTHONPATH). A project directory of its own declares TABLES
module tables (HTTP, to a local sink) in its outbox.toml; ``dev`` starts with its defaults on an embedded
PostgreSQL of this script's; 20 s after start-up 50 messages go into every table in one transaction (issue 23's
set-up); for up to SECONDS (120) the script polls which tables have all 50 sent, and samples the resident memory
and the number of processes under dev. It prints one JSON line: tables drained, the slowest and median drain,
the peak GiB and processes. The harness (the sink, dev's process handling) is this repository's test code.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402

from outbox_pipelines import Message, Outbox  # noqa: E402
from outbox_pipelines.core.storage.schema import create_table  # noqa: E402
from outbox_pipelines_tests.drills.conftest import DevProcess  # noqa: E402
from outbox_pipelines_tests.helpers import free_port  # noqa: E402
from outbox_pipelines_tests.scratch import ScratchServer, TemplateDatabases  # noqa: E402
from outbox_pipelines_tests.sink import HttpSink  # noqa: E402

PER_TABLE = 50


def _resident(dev: DevProcess) -> tuple[int, int]:
    total = count = 0
    for pid in dev.leftovers():
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                count += 1
    return total, count


def measure(checkout: Path, n: int, wait_s: float) -> dict[str, Any]:
    server = ScratchServer.from_env("OUTBOX_BENCH_DATABASE_URL", dir_prefix="outbox-many-tables-pg-")
    tmp = Path(tempfile.mkdtemp(prefix="outbox-many-tables-"))
    sink = HttpSink().start()
    dev: DevProcess | None = None
    try:
        _, url = TemplateDatabases(server.admin_url, prefix="many").create_database()
        project = tmp / "service"
        project.mkdir()
        (project / "pyproject.toml").write_text('[project]\nname = "service"\nversion = "1"\n')
        tables = [f"mod{i:02d}_outbox" for i in range(n)]
        (project / "outbox.toml").write_text(
            "\n".join(
                f'[tables.{t}]\ndestination = "http"\nurl = "{sink.url}{t}"\nmode = "competing"\n' for t in tables
            )
        )
        for table in tables:
            create_table(url, table)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
        env.update(
            PYTHONPATH=str(checkout),
            OUTBOX_DATABASE_URL=url,
            DAGSTER_HOME=str(tmp / "dagster_home"),
            PYTHONUNBUFFERED="1",
        )
        dev = DevProcess(free_port(), tmp / "dev.log", env, project)
        dev.start()
        dev.wait_ready(240)
        time.sleep(20)
        with psycopg.connect(url) as conn:
            for table in tables:
                Outbox(table).enqueue_many(
                    conn, [Message(topic="m", payload={"n": i}, event_id=f"{table}-{i}") for i in range(PER_TABLE)]
                )
            conn.commit()
        started, drained, peak_rss, peak_processes = time.monotonic(), {}, 0, 0
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            while time.monotonic() - started < wait_s and len(drained) < n:
                for table in tables:
                    if (
                        table not in drained
                        and conn.execute(f"SELECT count(*) AS n FROM {table} WHERE status = 'sent'").fetchone()["n"]
                        == PER_TABLE
                    ):
                        drained[table] = round(time.monotonic() - started, 1)
                rss, processes = _resident(dev)
                peak_rss, peak_processes = max(peak_rss, rss), max(peak_processes, processes)
                time.sleep(1)
        times = sorted(drained.values())
        return {
            "checkout": str(checkout),
            "tables": n,
            "drained": len(drained),
            "undrained_after_s": None if len(drained) == n else wait_s,
            "drain_s_max": times[-1] if times else None,
            "drain_s_median": times[len(times) // 2] if times else None,
            "peak_rss_gib": round(peak_rss / 1024**3, 2),
            "peak_processes": peak_processes,
        }
    finally:
        if dev is not None:
            dev.stop(signal.SIGTERM, 60)
            dev.kill_leftovers()
        sink.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    print(
        json.dumps(
            measure(Path(sys.argv[1]).resolve(), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 120.0)
        )
    )
