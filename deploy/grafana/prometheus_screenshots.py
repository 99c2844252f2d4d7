#!/usr/bin/env python3
"""Screenshots of the Grafana dashboard's key queries in Prometheus's own graph view
(docs/screenshots/prometheus-*.png, shown in docs/how-to/grafana.md). Grafana has no Debian or PyPI package to
run here; Debian's ``prometheus`` package has the server. Everything on 127.0.0.1 and under one temp dir:

1. an embedded PostgreSQL, ``db upgrade`` of a project with the examples' tables (retries after 300 ms);
2. two real relays, ``outbox-pipelines relay --table outbox_events|outbox_memory --metrics-port P``, while this
   script enqueues into both for ``--minutes``: most messages delivered, some retried once (``demo.flaky``),
   some dead (``org.changed`` without ``org_id``), at a rate that rises and falls;
3. ``/usr/bin/prometheus`` scraping both relays every 2 s;
4. headless Chromium (Debian's ``chromium``, driven by Playwright) on Prometheus's graph page with three of the
   dashboard's queries, as its JSON has them (``$__rate_interval`` as 30s, every table); each graph is captured
   once its legend lists both tables.

At the end it stops what it started, by pid, and removes the temp dir.

Usage: .venv/bin/python deploy/grafana/prometheus_screenshots.py [--out docs/screenshots] [--minutes 4]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = Path(__file__).with_name("outbox-dashboard.json")
PROMETHEUS = Path("/usr/bin/prometheus")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}
HOST = "127.0.0.1"
TABLES = ("outbox_events", "outbox_memory")
PROJECT = """parts = ["orders", "examples"]
[tables.outbox_events]
base = "300ms"
max_backoff = "2s"
max_attempts = 4
"""
# (file, panel title, refId, stacked): the dashboard's queries shown.
SHOTS = (
    ("prometheus-throughput.png", "Settled by result", "A", True),
    ("prometheus-delivery-latency.png", "Delivery latency, created → sent", "C", False),
    ("prometheus-dead.png", "Dead messages and blocked keys in the table", "A", False),
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def dashboard_query(title: str, ref: str) -> str:
    """A query of the dashboard as Prometheus gets it from Grafana with every table selected."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    expr: str = next(
        t["expr"] for p in panels if p["title"] == title for t in p.get("targets", []) if t["refId"] == ref
    )
    return expr.replace("$__rate_interval", "30s").replace('"$table"', '".*"')


def stop(process: subprocess.Popen[Any], what: str) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    print(f"stopped {what} (pid {process.pid})")


def produce(url: str, seconds: float) -> int:
    """Enqueue into both tables for ``seconds``, in the examples' topics; returns how many messages."""
    import psycopg

    from outbox_pipelines import Message, Outbox

    events, memory = Outbox("outbox_events"), Outbox("outbox_memory")
    started, tick, total = time.monotonic(), 0, 0
    with psycopg.connect(url) as conn:
        while time.monotonic() - started < seconds:
            wave = 1 + 0.6 * math.sin((time.monotonic() - started) / 25)
            batch = [Message("org.changed", {"org_id": tick * 100 + i}) for i in range(round(8 * wave))]
            if tick % 4 == 0:
                batch.append(Message("demo.flaky", {"tick": tick}))
            if tick % 15 == 7:
                batch.append(Message("org.changed", {"note": "no org_id: dead"}))
            notes = [Message("space:team", {"note": f"fact {tick}-{i}"}) for i in range(round(4 * wave))]
            with conn.transaction():
                events.enqueue_many(conn, batch)
                memory.enqueue_many(conn, notes)
            total += len(batch) + len(notes)
            tick += 1
            time.sleep(0.5)
    return total


def capture(prometheus: str, out: Path, minutes: int, timeout_s: float) -> list[Path]:
    from playwright.sync_api import sync_playwright

    params: dict[str, str] = {}
    for i, (_, title, ref, stacked) in enumerate(SHOTS):
        params |= {
            f"g{i}.expr": dashboard_query(title, ref),
            f"g{i}.tab": "0",
            f"g{i}.stacked": "1" if stacked else "0",
            f"g{i}.range_input": f"{minutes}m",
        }
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{prometheus}/graph?{urllib.parse.urlencode(params)}")
            for i, (file, *_) in enumerate(SHOTS):
                wrapper = f"#graph_wrapper{i}"
                for table in TABLES:
                    page.locator(f"{wrapper} .legend li.line", has_text=table).first.wait_for(timeout=timeout_s * 1000)
                page.wait_for_timeout(500)  # the legend is drawn with the graph's last paths
                target = out / file
                page.locator(wrapper).screenshot(path=str(target))
                if shutil.which("optipng"):
                    subprocess.run(["optipng", "-quiet", "-o2", str(target)], check=False)
                print(f"  {target} ({target.stat().st_size // 1024} KB)")
                written.append(target)
        finally:
            browser.close()
    return written


def run(tmp: Path, out: Path, minutes: int, processes: list[tuple[subprocess.Popen[Any], str]]) -> int:
    from outbox_pipelines.core.storage import db

    url = db.start_embedded(tmp / "outbox", database="outbox")
    print(f"embedded PostgreSQL under {tmp / 'outbox'}")
    (tmp / "outbox.toml").write_text(PROJECT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env |= {"OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "outbox_pipelines.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, cwd=tmp, check=True, capture_output=True)

    seconds = minutes * 60
    ports = {table: free_port() for table in TABLES}
    for table, port in ports.items():
        argv = [*cli, "relay", "--table", table, "--quiet", "--metrics-port", str(port)]
        argv += ["--max-seconds", str(seconds + 120)]
        log = (tmp / f"relay-{table}.log").open("w")
        processes.append((subprocess.Popen(argv, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT), table))
        wait_http(f"http://{HOST}:{port}/metrics", 30)
    targets = ", ".join(f'"{HOST}:{port}"' for port in ports.values())
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n"
        f"scrape_configs:\n  - job_name: outbox-relay\n    static_configs: [{{targets: [{targets}]}}]\n"
    )
    web = free_port()
    prometheus = [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}"]
    prometheus += [f"--web.listen-address={HOST}:{web}"]
    log = (tmp / "prometheus.log").open("w")
    processes.append((subprocess.Popen(prometheus, stdout=log, stderr=subprocess.STDOUT), "prometheus"))
    wait_http(f"http://{HOST}:{web}/-/ready", 30)
    print(f"relays on {sorted(ports.values())}, Prometheus on http://{HOST}:{web}; enqueuing for {minutes} min")

    count = produce(url, seconds)
    print(f"enqueued {count} messages; capturing into {out}:")
    time.sleep(6)  # three more scrapes: the last messages settled and counted
    written = capture(f"http://{HOST}:{web}", out, minutes, timeout_s=60)
    print(f"wrote {len(written)} screenshots")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="where the PNGs go")
    parser.add_argument("--minutes", type=int, default=4, help="how long messages flow before the capture")
    args = parser.parse_args(argv)
    for binary, package in ((PROMETHEUS, "prometheus"), (CHROMIUM, "chromium")):
        if not binary.exists():
            print(f"error: {binary} is missing: apt-get install --no-install-recommends {package}", file=sys.stderr)
            return 2
    sys.path.insert(0, str(REPO))
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="outbox-prometheus-shots-"))
    processes: list[tuple[subprocess.Popen[Any], str]] = []
    try:
        return run(tmp, out, args.minutes, processes)
    finally:
        for process, what in reversed(processes):
            stop(process, what)
        from outbox_pipelines.core.storage import db

        pgdata = (tmp / "outbox" / "pgdata").resolve()  # as root, a link to a directory the server user can enter
        if db.stop_embedded(tmp / "outbox"):
            print("stopped the embedded PostgreSQL")
        if pgdata.is_relative_to(db.RELOCATED_DATA_BASE):
            shutil.rmtree(pgdata.parent, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
