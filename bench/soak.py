"""Run the soak tests once and tabulate their figures in bench/soak.md.

Runs ``pytest -m soak outbox_pipelines_tests/soak outbox_pipelines_tests/api -q`` with
OUTBOX_SOAK_RESULTS pointing at a file where every soak appends its figures as one JSON
line, and a JUnit XML report for each test's outcome, time and printed output. Then
writes bench/soak.md — one table per test: messages, duration, lost, dead, executed
twice, duplicate deliveries (broker repeats), rows left in sending, recovery time, then
the test's other figures — and prints it.

The soaks (all real processes, each on its own embedded PostgreSQL in a temp dir):

- chaos: 30,000 orders, 8 relays, one SIGKILLed and restarted every 7 s, broker 25 % faults;
- hard PostgreSQL restart (pg_ctl stop -m immediate) mid-drain of 20,000 orders, 10 s down;
- 10-minute broker outage and 10-minute 429 storm, side by side;
- the Order API (`outbox-pipelines order-api`, its own process) against a table locked for 45 s
  (outbox_pipelines_tests/api).

About 20 minutes on 2 cores at --scale 1 (under 30).

    .venv/bin/python bench/soak.py                   # the real thing
    .venv/bin/python bench/soak.py --scale 0.1       # a quick pass: counts and fault durations x 0.1
    .venv/bin/python bench/soak.py -- -x -k chaos    # extra pytest arguments after --
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from obench.code_version import measured_code  # bench/ is the script's folder, first on sys.path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "soak.md"
TARGETS = ["outbox_pipelines_tests/soak", "outbox_pipelines_tests/api"]

# The figures every soak reports, in this order, with their labels.
MAIN = [
    ("messages", "messages"),
    ("duration_s", "duration (s)"),
    ("lost", "lost"),
    ("dead", "dead"),
    ("executed_twice", "executed twice at the broker"),
    ("duplicate_deliveries", "duplicate deliveries (broker repeats, answered 409)"),
    ("left_in_sending", "left in sending"),
    ("recovery_s", "recovery (s)"),
]
SKIP = {"test", "problems", "scale"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/soak.py",
        description=(
            "Run the soak tests (pytest -m soak outbox_pipelines_tests/soak outbox_pipelines_tests/api -q) once "
            "and write their figures to bench/soak.md, one table per test: messages, duration, lost, dead, "
            "executed twice, duplicate deliveries, left in sending, recovery time, and the test's other figures. "
            "Each soak starts its own embedded PostgreSQL, broker simulator and relay processes on 127.0.0.1 and "
            "stops them by pid; the API soak uses the test session's server. About 20 minutes on 2 cores."
        ),
        epilog=(
            "OUTBOX_SOAK_SCALE (what --scale sets) scales message counts and fault durations; "
            "OUTBOX_SOAK_KEEP_TMP=1 keeps every soak's temp dir (relay, broker and PostgreSQL logs). "
            "Arguments after -- go to pytest, e.g. `bench/soak.py --scale 0.1 -- -x -k chaos`."
        ),
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=None,
        help="scale message counts and fault durations (default: $OUTBOX_SOAK_SCALE or 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"Markdown file to write (default {DEFAULT_OUT.relative_to(REPO)})",
    )
    parser.add_argument(
        "--results", type=Path, default=None, help="also keep the raw JSON lines here (default: a temp file, removed)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.scale is not None and not 0 < args.scale <= 10:
        parser.error("--scale must be in (0, 10]")
    return args


def run_pytest(args: argparse.Namespace, results: Path, junit: Path) -> tuple[int, float]:
    env = dict(os.environ)
    env["OUTBOX_SOAK_RESULTS"] = str(results)
    if args.scale is not None:
        env["OUTBOX_SOAK_SCALE"] = f"{args.scale:g}"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "soak",
        *TARGETS,
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "-o",
        "junit_logging=system-out",
        *args.pytest_args,
    ]
    print("$ " + " ".join(command[2:]), flush=True)
    started = time.monotonic()
    code = subprocess.call(command, cwd=REPO, env=env)
    return code, time.monotonic() - started


def read_junit(junit: Path) -> list[dict[str, Any]]:
    """Each test case: name, outcome, seconds, printed output."""
    if not junit.exists():
        return []
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                message = (element.get("message") or "").strip()
                if message:
                    outcome += f": {message.splitlines()[0][:300]}"
                break
        out = case.find("system-out")
        cases.append(
            {
                "name": case.get("name", "?"),
                "file": case.get("classname", ""),
                "outcome": outcome,
                "seconds": float(case.get("time") or 0.0),
                "output": out.text if out is not None and out.text else "",
            }
        )
    return cases


def read_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, sort_keys=False)
    else:
        text = str(value)
    return text.replace("|", "\\|")


def figures_table(figures: dict[str, Any]) -> list[str]:
    lines = ["| figure | value |", "|---|---|"]
    for key, label in MAIN:
        value = figures.get(key)
        if key == "recovery_s" and figures.get("recovery_means"):
            label += f" — {figures['recovery_means']}"
        lines.append(f"| **{label}** | {cell(value)} |")
    for key, value in figures.items():
        if key in SKIP or key == "recovery_means" or key in dict(MAIN):
            continue
        lines.append(f"| {key} | {cell(value)} |")
    problems = figures.get("problems")
    if problems:
        lines.append(f"| **problems** | {cell('; '.join(problems))} |")
    return lines


def soak_lines_of(output: str) -> list[str]:
    """What a test printed about itself (lines starting 'soak'), for tests that record no figures."""
    return [
        line.strip()
        for line in output.splitlines()
        if line.strip().lower().startswith("soak") and not line.startswith("SOAK RESULT")
    ]


def measured_commit() -> str:
    """HEAD, and whether the code measured differed from it (the tests and the core count)."""
    head, dirty = measured_code(("outbox_pipelines", "outbox_pipelines_tests", "sql"))
    return f"{head or 'unknown'} with uncommitted changes" if dirty else head or "unknown"


def render(
    cases: list[dict[str, Any]], results: list[dict[str, Any]], code: int, seconds: float, scale: str, commit: str
) -> str:
    lines = [
        "# Soak tests",
        "",
        (
            f"`.venv/bin/python bench/soak.py` — {time.strftime('%Y-%m-%d %H:%M')}, scale {scale}, "
            f"{os.cpu_count()} CPUs ({platform.machine()}), pytest exit code {code}, {seconds / 60:.1f} min in all. "
            f"Commit {commit}."
        ),
        "",
        (
            "Each soak runs real processes (`outbox-pipelines relay --table outbox_orders`, `outbox-pipelines "
            "broker-sim`) on its own embedded PostgreSQL. *Lost*: orders not `sent` (or never executed at the "
            "broker). *Executed twice*: keys the broker executed more than once (it executes a key once, so this "
            "checks the simulator). *Duplicate deliveries*: requests for a key the broker had already executed "
            '(answered 409 "already processed"), i.e. what at-least-once delivery cost.'
        ),
        "",
    ]
    by_test: dict[str, dict[str, Any]] = {}
    for figures in results:
        by_test[str(figures.get("test"))] = figures
    used: set[str] = set()
    for case in cases:
        lines.append(f"## {case['name']}")
        lines.append("")
        lines.append(f"{case['outcome']} in {case['seconds']:.0f} s (`{case['file']}`)")
        lines.append("")
        mine = []
        for printed in case["output"].splitlines():
            if printed.startswith("SOAK RESULT "):
                try:
                    test = str(json.loads(printed[len("SOAK RESULT ") :]).get("test"))
                except ValueError:
                    continue
                if test in by_test and test not in used:
                    used.add(test)
                    mine.append((test, by_test[test]))
        for test, figures in mine:
            if len(mine) > 1:
                lines += [f"### {test}", ""]
            lines += figures_table(figures) + [""]
        if not mine:
            said = soak_lines_of(case["output"])
            lines += ["| figure | value |", "|---|---|"]
            lines.append(f"| duration (s) | {case['seconds']:.0f} |")
            for line in said:
                lines.append(f"| printed | {cell(line)} |")
            if not said:
                lines.append("| printed | – (no figures recorded) |")
            lines.append("")
    for test, figures in by_test.items():
        if test not in used:
            lines += [f"## {test}", "", *figures_table(figures), ""]
    if not cases and not results:
        lines += ["No soak ran (see the pytest output above).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scale = f"{args.scale:g}" if args.scale is not None else os.environ.get("OUTBOX_SOAK_SCALE", "1")
    commit = measured_commit()  # before the run: the code it measured
    with tempfile.TemporaryDirectory(prefix="outbox-soak-bench-") as tmp:
        results = args.results or Path(tmp) / "results.jsonl"
        if args.results and results.exists():
            results.unlink()
        junit = Path(tmp) / "junit.xml"
        code, seconds = run_pytest(args, results, junit)
        text = render(read_junit(junit), read_results(results), code, seconds, scale, commit)
    args.out.write_text(text + "\n")
    print("\n" + text)
    print(f"\nwritten to {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
