#!/usr/bin/env python3
"""Regenerate the Dagster UI screenshots of the README (docs/screenshots/*.png).

Everything happens on 127.0.0.1 and under one temporary directory, so the
user's ./.outbox/ and Dagster home are never touched:

1. an embedded PostgreSQL in the temp dir, migrated, with Dagster's storage on it;
2. ``outbox_pipelines.demo.run.run_demo``: samples relayed through the Dagster relay
   jobs (broker simulator with 503 / 429 / 400 faults), then the checks job;
3. ``dagster-webserver`` on a free loopback port (no daemon: nothing new runs);
4. headless Chromium driven over the Chrome DevTools Protocol: each page is
   opened, the script waits until the page's text shows the data expected on it
   (the UI is a single-page app that loads data asynchronously), then captures.

At the end it stops what it started (webserver and Chromium by process group,
PostgreSQL by its pid) and removes the temp dir.

Usage: .venv/bin/python scripts/screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
WINDOW = (1600, 1000)
MAX_HEIGHT = 2000
HOST = "127.0.0.1"
MAX_PNG_BYTES = 400_000
ORDERS_ASSET = "outbox/outbox_orders"
ORDERS_RELAY_JOB = "relay_group_default_job"  # the demo's relay runs: its one relay group

# Every OUTBOX_* variable (database, Dagster storage, broker, webhook, mail dir, settings file...) and
# DAGSTER_HOME could point the run at the user's own services or change the demo: the script clears
# them and sets only its own, so the screenshots show the defaults.
ISOLATED_ENV_PREFIX = "OUTBOX_"


@dataclass(frozen=True)
class Shot:
    """One screenshot: a UI path, the texts that prove its data has loaded, optional clicks first."""

    file: str
    path: str
    expect: tuple[str, ...]
    what: str
    # JavaScript run once the expected texts are there (e.g. a click); then `expect_after` is awaited.
    action: str | None = None
    expect_after: tuple[str, ...] = ()
    # Grow the viewport (up to MAX_HEIGHT) so a list that scrolls inside the page is captured whole.
    fit_height: bool = False


@dataclass
class Started:
    """What this script started, so it can stop exactly that and nothing else."""

    tmp: Path
    groups: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    embedded_root: Path | None = None


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group started with start_new_session=True, SIGKILL what is left after grace_s."""
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            continue
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


def wait_http(url: str, name: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")


def isolated_environment(tmp: Path, started: Started) -> str:
    """Embedded PostgreSQL, migrations and a Dagster home, all under tmp, in os.environ; returns the outbox URL."""
    from outbox_pipelines.core.storage import db, migrate
    from outbox_pipelines.defs.dagster_home import prepare_dagster_home

    for name in [n for n in os.environ if n.startswith(ISOLATED_ENV_PREFIX) or n == "DAGSTER_HOME"]:
        del os.environ[name]
    root = tmp / "outbox"
    # run_demo writes its settings file under the embedded dir: keep that in tmp as well.
    os.environ[db.EMBEDDED_DIR_ENV] = str(root)
    os.environ["DAGSTER_HOME"] = str(tmp / "dagster_home")
    started.embedded_root = root
    url = db.start_embedded(root, database="outbox")
    print(f"embedded PostgreSQL under {root}")
    migrate.upgrade(url)
    os.environ[db.DATABASE_URL_ENV] = url
    os.environ.update(prepare_dagster_home(url))
    return url


def start_webserver(tmp: Path, started: Started) -> str:
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "dagster-webserver"),
        "-m",
        "outbox_pipelines.definitions",
        "-h",
        HOST,
        "-p",
        str(port),
    ]
    # The UI loads the same outbox_pipelines as this script (the checkout it sits in, even if another is installed).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # start_new_session: the webserver and its code server form one group we can stop together.
    with (tmp / "webserver.log").open("wb") as log:
        proc = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    started.groups.append(("dagster-webserver", proc))
    base = f"http://{HOST}:{port}"
    try:
        wait_http(base + "/server_info", "dagster-webserver", proc, timeout_s=180)
    except (RuntimeError, TimeoutError):
        sys.stderr.write((tmp / "webserver.log").read_text(errors="replace")[-4000:])
        raise
    print(f"dagster-webserver on {base}")
    return base


def dismiss_community_popup(base: str) -> None:
    """The UI opens a "Join the Dagster community" dialog on loopback origins until the instance
    records it as seen; record that (in the throw-away Dagster home) so it covers no screenshot."""
    request = urllib.request.Request(
        base + "/graphql",
        data=json.dumps({"query": "mutation { setNuxSeen }"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def start_chromium(tmp: Path, started: Started) -> str:
    """Headless Chromium with a DevTools port of its own choosing; returns the page's websocket URL."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp))
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        # Port 0: Chromium picks a free one and writes it to <profile>/DevToolsActivePort.
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    with (tmp / "chromium.log").open("wb") as log:
        # TMPDIR: Chromium leaves its singleton socket dir (org.chromium.Chromium.*) there; keep it in tmp.
        proc = subprocess.Popen(
            command,
            env={**os.environ, "TMPDIR": str(tmp)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started.groups.append(("chromium", proc))
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not (active.exists() and active.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.stderr.write((tmp / "chromium.log").read_text(errors="replace")[-4000:])
            raise RuntimeError("Chromium did not open its DevTools port")
        time.sleep(0.2)
    port = int(active.read_text().splitlines()[0])
    with urllib.request.urlopen(f"http://{HOST}:{port}/json/list", timeout=10) as answer:
        targets = json.load(answer)
    return str(next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"))


def stop_everything(started: Started) -> None:
    for name, proc in reversed(started.groups):
        stop_group(proc)
        print(f"stopped {name} (process group {proc.pid})")
    if started.embedded_root is not None:
        from outbox_pipelines.core.storage import db

        if db.stop_embedded(started.embedded_root):
            print("stopped the embedded PostgreSQL")
    shutil.rmtree(started.tmp, ignore_errors=True)


# --------------------------------------------------------------------------- the demo data


class DemoBroken(RuntimeError):
    """The demo ran but delivered nothing: screenshots of it would mislead the README's readers."""


def interesting_relay_run() -> str:
    """The outbox_orders relay run with the most to show: something sent, something retried or dead."""
    import dagster as dg

    best: tuple[int, str, dict[str, Any]] | None = None
    with dg.DagsterInstance.get() as instance:
        for run in instance.get_runs(filters=dg.RunsFilter(job_name=ORDERS_RELAY_JOB)):
            values: dict[str, Any] = {}
            for record in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_OUTPUT):
                if record.dagster_event is not None:
                    metadata = record.dagster_event.step_output_data.metadata
                    values.update({k: getattr(v, "value", v) for k, v in metadata.items()})
            orders = (values.get("tables") or {}).get("outbox_orders") or {}
            sent, retried, dead = (int(orders.get(k) or 0) for k in ("sent", "retried", "dead"))
            score = (sent > 0) * 4 + (dead > 0) * 2 + (retried > 0)
            if best is None or score > best[0]:
                best = (score, run.run_id, values)
    if best is None:
        raise DemoBroken(f"the demo recorded no {ORDERS_RELAY_JOB} run")
    if not ((best[2].get("tables") or {}).get("outbox_orders") or {}).get("sent"):
        dead_by_code = best[2].get("problems") or "-"
        raise DemoBroken(
            f"no {ORDERS_RELAY_JOB} run of the demo delivered an order (dead by code: {dead_by_code}); "
            "fix the demo before regenerating the screenshots"
        )
    return best[1]


# --------------------------------------------------------------------------- Chrome DevTools Protocol


TICKING = re.compile(r"(?m)^(\d{1,2}:\d{2}|Refreshing data…)$")


class Page:
    """Just enough CDP for one tab: commands answered in order; events are ignored."""

    def __init__(self, socket_: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = socket_
        self._id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self._ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            message = await self._ws.receive_json(timeout=60)
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    async def set_height(self, height: int) -> None:
        await self.call(
            "Emulation.setDeviceMetricsOverride", width=WINDOW[0], height=height, deviceScaleFactor=1, mobile=False
        )

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def wait_for_text(self, texts: tuple[str, ...], timeout_s: float) -> None:
        """Until the page shows every text, and its text has stopped changing (the last queries landed)."""
        deadline = time.monotonic() + timeout_s
        previous, stable_since = "", time.monotonic()
        while time.monotonic() < deadline:
            body = str(await self.evaluate("document.body ? document.body.innerText : ''"))
            # The refresh countdown ("0:07") and "Refreshing data…" change every second: not content.
            body = TICKING.sub("", body)
            if body != previous:
                previous, stable_since = body, time.monotonic()
            elif all(t in body for t in texts) and time.monotonic() - stable_since > 1.5:
                return
            await asyncio.sleep(0.3)
        missing = [t for t in texts if t not in previous]
        raise TimeoutError(f"page never showed {missing}; it shows: {previous[:600]!r}")


async def capture(page_ws: str, base: str, shots: list[Shot], out: Path, timeout_s: float) -> list[Path]:
    written: list[Path] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(page_ws, max_msg_size=0) as ws:
        page = Page(ws)
        await page.call("Page.enable")
        await page.set_height(WINDOW[1])
        for shot in shots:
            await page.call("Page.navigate", url=base + shot.path)
            await page.wait_for_text(shot.expect, timeout_s)
            if shot.action:
                if not await page.evaluate(shot.action):
                    raise RuntimeError(f"{shot.file}: the page has nothing to click for {shot.action[:60]!r}")
                await page.wait_for_text(shot.expect_after or shot.expect, timeout_s)
            if shot.fit_height:
                await page.set_height(min(WINDOW[1] + int(await page.evaluate(OVERFLOW)), MAX_HEIGHT))
                await page.wait_for_text(shot.expect, timeout_s)
            data = await page.call("Page.captureScreenshot", format="png")
            if shot.fit_height:
                await page.set_height(WINDOW[1])
            target = out / shot.file
            target.write_bytes(base64.b64decode(data["data"]))
            shrink(target)
            written.append(target)
            print(f"  {target} ({target.stat().st_size // 1024} KB): {shot.what}")
    return written


def shrink(png: Path) -> None:
    """Lossless optipng pass only when a capture is over the size budget (and optipng is there)."""
    if png.stat().st_size <= MAX_PNG_BYTES:
        return
    if shutil.which("optipng"):
        subprocess.run(["optipng", "-quiet", "-o2", str(png)], check=False)
    if png.stat().st_size > MAX_PNG_BYTES:
        print(
            f"warning: {png.name} is {png.stat().st_size // 1024} KB (budget {MAX_PNG_BYTES // 1000} KB)",
            file=sys.stderr,
        )


# How many pixels the page's content overflows its scroll containers (the UI scrolls inside
# elements, not the document, so a full-page capture would not show more).
OVERFLOW = """Math.max(0, ...[...document.querySelectorAll('body *')]
  .filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowY))
  .map(e => e.scrollHeight - e.clientHeight))"""

# Clicks "View full message" on the run log's ASSET_OBSERVATION row: the log truncates metadata
# tables to a few rows; the dialog shows all of them.
OPEN_OBSERVATION = """(() => {
  const rowOf = b => {
    let r = b;
    while (r && !/ASSET_OBSERVATION|STEP_OUTPUT/.test(r.innerText)) r = r.parentElement;
    return r;
  };
  const button = [...document.querySelectorAll('button')]
    .filter(b => b.innerText.trim() === 'View full message')
    .find(b => {
      const r = rowOf(b);
      return r && r.innerText.includes('ASSET_OBSERVATION') && !r.innerText.includes('STEP_OUTPUT');
    });
  if (button) button.click();
  return !!button;
})()"""


# The launchpad's help panel documents the config at the editor's cursor: put it inside the op's config.
CURSOR_IN_REPLAY_CONFIG = """(() => {
  const host = document.querySelector('.CodeMirror');
  if (!host || !host.CodeMirror) return false;
  const cm = host.CodeMirror;
  cm.focus();
  cm.setCursor({line: 3, ch: 6});
  return true;
})()"""


def shots_for(run_id: str) -> list[Shot]:
    return [
        Shot(
            "runs.png",
            "/runs",
            expect=(ORDERS_RELAY_JOB, "outbox_checks_job", "outbox/trigger: demo", "Success"),
            what="the Runs list: the demo's relay runs (tagged outbox/table, outbox/trigger) and the checks run",
        ),
        Shot(
            "relay-run.png",
            f"/runs/{run_id}",
            expect=("relay_table", "ASSET_OBSERVATION", "RUN_SUCCESS"),
            action=OPEN_OBSERVATION,
            expect_after=("Done", "throughput_per_s", "lag_p95_s", "stopped_because"),
            what="an outbox_orders relay run with its ASSET_OBSERVATION opened: sent, retried, dead, conflicts, "
            "throughput, lag p50/p95/p99, backlog after",
        ),
        Shot(
            "asset-checks.png",
            f"/assets/{ORDERS_ASSET}?view=checks&checkDetail=dead_letters",
            expect=("Checks (5)", "backlog", "destination", "stuck", "BAD_REQUEST", "Metadata"),
            what="the outbox/outbox_orders checks: dead_letters at WARN (an alert-worthy check) with the "
            "replay command to run in its description, the other checks passed; Execute runs them",
        ),
        Shot(
            "replay-launchpad.png",
            "/locations/outbox_pipelines.definitions/jobs/replay_dead_job/playground",
            expect=("replay_dead_op", "dry_run"),
            action=CURSOR_IN_REPLAY_CONFIG,
            expect_after=("Filter:", "time of death"),
            what="the replay_dead_job launchpad: every config field described (filters, time of death, "
            "dry run first, all, force)",
        ),
        Shot(
            "automation.png",
            "/automation",
            expect=(
                "relay_group_default_every_30_minutes",
                "relay_group_default_on_backlog",
                "outbox_oncall",
                "outbox_run_failure_alert",
            ),
            fit_height=True,
            what="schedules and sensors: 30-minute relay runs, backlog sensors, the on-call sensor, maintenance",
        ),
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Regenerate the Dagster UI screenshots of the README: runs the demo on a throw-away embedded "
        "PostgreSQL and Dagster home in a temp dir, serves the UI on loopback, captures it with headless "
        "Chromium. Never touches ./.outbox/."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "docs" / "screenshots",
        help="directory for the PNG files (default: docs/screenshots)",
    )
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for each page to show its data (default: 90)"
    )
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM takes the same clean-up path as Ctrl-C."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not CHROMIUM.exists():
        print(f"error: {CHROMIUM} is missing; install it with: apt-get install -y chromium", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))  # the outbox_pipelines of this checkout, even if another is installed
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # keep order with stderr in logs
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    started = Started(Path(tempfile.mkdtemp(prefix="outbox-screenshots-")))
    signal.signal(signal.SIGTERM, _interrupt)
    written: list[Path] = []
    try:
        url = isolated_environment(started.tmp, started)
        from outbox_pipelines.demo.run import run_demo

        print("running the demo (relay runs and checks into the temporary Dagster instance)...")
        run_demo(url, quiet=True)
        run_id = interesting_relay_run()
        base = start_webserver(started.tmp, started)
        dismiss_community_popup(base)
        page_ws = start_chromium(started.tmp, started)
        print(f"capturing into {out}:")
        written = asyncio.run(capture(page_ws, base, shots_for(run_id), out, args.timeout))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_everything(started)
    print(f"wrote {len(written)} screenshots in {time.monotonic() - began:.0f}s:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
