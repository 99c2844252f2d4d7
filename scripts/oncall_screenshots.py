#!/usr/bin/env python3
"""Regenerate the on-call screenshots of the docs (docs/screenshots/oncall-*.png), issue 43.

The scenario of the browser tests (outbox_pipelines_tests/browser/scenario.py) at twenty tables: dead
messages, two ordering keys blocked by a dead head, a destination down, a paused topic, a table broken in
its settings, fifteen healthy tables. Everything on 127.0.0.1 and under temporary directories:

1. an embedded PostgreSQL in a temp dir (or the server OUTBOX_TEST_DATABASE_URL names), a database for it;
2. the project and its data, then a real ``outbox-pipelines dev --port <free>`` in the project, until its
   on-call sensor has ticked once;
3. ``--runs-minutes`` of schedules and sensors (a few messages into every healthy table each minute, as
   traffic would), so the Runs list shows what a quiet day leaves;
4. headless Chromium (Debian's ``chromium``, driven by Playwright) at 1280x800: each page is opened, the
   script waits until it shows the data expected on it and its text has settled, then captures it.

At the end it stops what it started, by pid. ``--code-root DIR`` runs dev on another checkout's code (the
"before" screenshots of an issue: ``git worktree add /tmp/before HEAD``).

Usage: .venv/bin/python scripts/oncall_screenshots.py [--out docs/screenshots] [--runs-minutes 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}
MAX_PNG_BYTES = 300_000
# Counters that change every second (the refresh countdown, a run's duration): not content.
ONCALL = "oncall:"  # a shot's path on the on-call page (its address is read from the table's asset page)
TICKING = re.compile(r"(?m)^(\d{1,2}:\d{2}(:\d{2})?|Refreshing data…)$")


@dataclass(frozen=True)
class Shot:
    """One screenshot: a path (or a link to follow), the texts that prove its data has loaded."""

    file: str
    path: str
    expect: tuple[str, ...]
    what: str
    optional: bool = False  # a page this checkout may not have yet (the "before" set): left out, said so
    height: int = VIEWPORT["height"]  # taller for a list that should show whole


def shots() -> list[Shot]:
    from outbox_pipelines_tests.browser.scenario import BLOCKED, BLOCKED_KEYS, DEAD, DEAD_EVENTS, DOWN, PAUSED

    return [
        Shot(
            "oncall-catalog.png",
            "/assets",
            expect=(DEAD, BLOCKED, DOWN, PAUSED),
            what="the Catalog: twenty tables, the failing ones marked",
            height=1440,
        ),
        Shot(
            "oncall-dead-letters.png",
            f"/assets/outbox/{DEAD}?view=checks&checkDetail=dead_letters",
            expect=("dead_letters", "BAD_REQUEST"),
            what=f"{DEAD}'s dead_letters check: the dead messages ({', '.join(DEAD_EVENTS)}) and their error",
            height=1200,
        ),
        Shot(
            "oncall-blocked-keys.png",
            f"/assets/outbox/{BLOCKED}?view=checks&checkDetail=blocked_keys",
            expect=("blocked_keys", BLOCKED_KEYS[0]),
            what=f"{BLOCKED}'s blocked_keys check: two keys held back by their dead head",
            height=1200,
        ),
        Shot(
            "oncall-table.png",
            f"/assets/outbox/{DEAD}",
            expect=(DEAD,),
            what=f"{DEAD}'s asset page: what it says about the table, its checks, its links",
        ),
        Shot(
            "oncall-page.png",
            ONCALL + "/",
            expect=(DEAD, BLOCKED, PAUSED),
            what="the on-call page: every table on one line, failing first",
            height=1200,
            optional=True,
        ),
        Shot(
            "oncall-page-table.png",
            ONCALL + f"/tables/{DEAD}",
            expect=(DEAD, DEAD_EVENTS[-1]),
            what=f"the on-call page of {DEAD}: its dead messages, newest first, Replay… on each row",
            optional=True,
        ),
        Shot("oncall-runs.png", "/runs", expect=("relay",), what="the Runs list after the minutes of schedules"),
    ]


def wait_settled(page: Any, texts: tuple[str, ...], timeout_s: float) -> None:
    """Until the page shows every text and its text has stopped changing for 1.5 s (the last queries landed)."""
    deadline = time.monotonic() + timeout_s
    previous, since = "", time.monotonic()
    while time.monotonic() < deadline:
        body = TICKING.sub("", page.inner_text("body"))
        if body != previous:
            previous, since = body, time.monotonic()
        elif all(t in body for t in texts) and time.monotonic() - since > 1.5:
            return
        page.wait_for_timeout(300)
    missing = [t for t in texts if t not in previous]
    raise TimeoutError(f"{page.url} never showed {missing}; it shows: {previous[:600]!r}")


def oncall_page_base(page: Any, base: str, table: str) -> str | None:
    """The on-call page's address, as the link on the table's asset page names it (None: no such link here)."""
    page.goto(f"{base}/assets/outbox/{table}")
    try:
        wait_settled(page, (table,), 60)
    except TimeoutError:
        return None
    link = page.get_by_role("link", name=re.compile(r"on-call|operator", re.I))
    if link.count() == 0:
        return None
    href = link.first.get_attribute("href")
    if not href:
        return None
    parts = urlsplit(str(href))
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else None


def shrink(png: Path) -> None:
    """A lossless optipng pass when optipng is installed (Debian's ``optipng``: about a fifth smaller)."""
    if shutil.which("optipng"):
        subprocess.run(["optipng", "-quiet", "-o2", str(png)], check=False)
    if png.stat().st_size > MAX_PNG_BYTES:
        print(f"warning: {png.name} is {png.stat().st_size // 1024} KB", file=sys.stderr)


def capture(base: str, out: Path, timeout_s: float, only: set[str]) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from outbox_pipelines_tests.browser.scenario import DEAD

    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            oncall = oncall_page_base(page, base, DEAD)
            for shot in shots():
                if only and shot.file not in only:
                    continue
                url = base + shot.path
                if shot.path.startswith(ONCALL):
                    if oncall is None:
                        print(f"  {shot.file}: left out, this checkout's asset page links to no on-call page")
                        continue
                    url = oncall + shot.path[len(ONCALL) :]
                page.set_viewport_size({"width": VIEWPORT["width"], "height": shot.height})
                page.goto(url)
                try:
                    wait_settled(page, shot.expect, timeout_s)
                except TimeoutError as exc:
                    if not shot.optional:
                        print(f"  {shot.file}: {exc}", file=sys.stderr)
                    else:
                        print(f"  {shot.file}: left out ({exc})")
                        continue
                target = out / shot.file
                page.screenshot(path=str(target))
                shrink(target)
                written.append(target)
                print(f"  {target} ({target.stat().st_size // 1024} KB): {shot.what}")
        finally:
            browser.close()
    return written


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Regenerate the on-call screenshots of the docs: twenty tables in the states on-call meets, "
        "under a real `outbox-pipelines dev` on loopback, captured with headless Chromium."
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="directory for the PNGs")
    parser.add_argument("--tables", type=int, default=20, help="tables in the scenario (default 20)")
    parser.add_argument(
        "--runs-minutes", type=float, default=3.0, help="minutes of schedules before the Runs list (default 3)"
    )
    parser.add_argument("--code-root", type=Path, default=REPO, help="the checkout whose code dev runs")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds for each page to show its data")
    parser.add_argument("--only", nargs="*", default=[], help="only these files (e.g. oncall-catalog.png)")
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not CHROMIUM.exists():
        print(f"error: {CHROMIUM} is missing; install it with: apt-get install chromium", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    from outbox_pipelines_tests.browser.scenario import OncallScenario
    from outbox_pipelines_tests.scratch import ScratchServer, TemplateDatabases

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-shots-pg-")
    scenario: OncallScenario | None = None
    try:
        databases = TemplateDatabases(server.admin_url, prefix=f"outbox_shots{os.getpid()}", parts=())
        name, url = databases.create_database()

        def drop() -> None:
            for database in (f"{name}_dagster"[:63], name, databases.template):
                databases.drop_database(database)

        scenario = OncallScenario(url, tables=args.tables, code_root=args.code_root.resolve(), on_close=drop)
        print(f"starting dev on {scenario.ui_url} with {args.tables} tables (code: {args.code_root})")
        seconds = scenario.start()
        print(f"dev ready, on-call sensor ticked: {seconds:.0f} s")
        scenario.dismiss_community_popup()
        until = time.monotonic() + args.runs_minutes * 60
        while time.monotonic() < until:
            scenario.trickle()
            time.sleep(min(60.0, max(until - time.monotonic(), 0.0)))
        print(f"capturing into {out}:")
        written = capture(scenario.ui_url, out, args.timeout, set(args.only))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if scenario is not None:
            scenario.close()
        server.stop()
    print(f"wrote {len(written)} screenshots in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
