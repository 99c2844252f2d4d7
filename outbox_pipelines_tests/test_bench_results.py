"""bench/run.py adds each run to bench/results.md and bench/results.json: a run of a few scenarios
(the usual way to re-measure one figure) must never erase the other scenarios' figures or the analysis
written in results.md beside them."""

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench_run() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # run.py imports its obench package from beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_run_under_test", BENCH / "run.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _figure(scenario: str, label: str, median: float) -> dict[str, Any]:
    stats = {"median": median, "min": median, "max": median, "runs": [median]}
    return {
        "scenario": scenario,
        "label": label,
        "unit": "ms",
        "ours": stats,
        "ceiling": None,
        "ceiling_label": None,
        "ratio": None,
        "target": None,
        "pass": None,
        "note": None,
    }


def _report(timestamp: str, commit: str, figures: dict[str, float]) -> dict[str, Any]:
    scenarios = list(dict.fromkeys(label.split()[0] for label in figures))
    return {
        "timestamp": timestamp,
        "command": "python bench/run.py " + " ".join(f"--scenario {s}" for s in scenarios),
        "runs": 1,
        "quick": False,
        "sizes": {"latency_rate": 500},
        "seconds": 60.0,
        "scenario_seconds": {s: 30.0 for s in scenarios},
        "machine": {
            "nproc": 2,
            "cpu_model": "cpu",
            "mem_total_gib": 1,
            "platform": "linux",
            "python": "3",
            "packages": {"psycopg": "3", "sqlalchemy": "2", "httpx": "0", "httpx-aiohttp": "0", "aiohttp": "3"},
            "git_commit": commit,
            "core_uncommitted_changes": False,
            "loadavg_at_start": [0.1],
            "loadavg_at_end": [0.2],
        },
        "postgres": {
            "server_version": "18",
            "server": "embedded",
            "shared_buffers": "128MB",
            "synchronous_commit": "on",
            "fsync": "on",
        },
        "figures": [_figure(label.split()[0], label, value) for label, value in figures.items()],
        "details": {s: {} for s in scenarios},
    }


def test_a_run_of_one_scenario_keeps_the_others_figures_and_every_earlier_section(bench_run, tmp_path):
    archive = tmp_path / "archive"
    first = _report("2026-01-01T00:00:00+00:00", "aaaaaaa", {"cleaner claim": 40.0, "checks cost": 6.0})
    bench_run.write_results(first, tmp_path, "results", archive)
    markdown_after_first = (tmp_path / "results.md").read_text()
    assert markdown_after_first.startswith("# outbox_pipelines benchmark results\n")
    assert "## How to run" in markdown_after_first

    # What the people measuring write under a run: it is theirs, and must survive the next run.
    analysis = "\n## Issue 99: what the cleaner's figure means\n\nThe claim is 0.93x the empty table.\n"
    (tmp_path / "results.md").write_text(markdown_after_first + analysis)

    second = _report("2026-02-02T00:00:00+00:00", "bbbbbbb", {"cleaner claim": 35.0})
    bench_run.write_results(second, tmp_path, "results", archive)

    markdown = (tmp_path / "results.md").read_text()
    newest = markdown.index("## Run of 2026-02-02T00:00:00+00:00: cleaner (commit bbbbbbb")
    older = markdown.index("## Run of 2026-01-01T00:00:00+00:00: cleaner, checks (commit aaaaaaa")
    assert newest < older, "the newest run comes first"
    assert markdown.count("# outbox_pipelines benchmark results") == 1
    assert markdown.endswith(analysis), "the written analysis is kept word for word"
    assert "| cleaner claim | 35.00 ms |" in markdown and "| cleaner claim | 40.00 ms |" in markdown

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["timestamp"] == "2026-02-02T00:00:00+00:00"
    assert [f["label"] for f in results["figures"]] == ["cleaner claim"]
    # The skipped scenario's latest figures stay, stamped with the run that measured them;
    # the re-measured one is not kept twice.
    assert set(results["earlier"]) == {"checks"}
    checks = results["earlier"]["checks"]
    assert (checks["timestamp"], checks["git_commit"]) == ("2026-01-01T00:00:00+00:00", "aaaaaaa")
    assert [f["ours"]["median"] for f in checks["figures"]] == [6.0]
    assert sorted(p.name for p in archive.iterdir()) == [
        "results-2026-01-01T000000+0000.json",
        "results-2026-02-02T000000+0000.json",
    ]


def test_an_older_results_json_with_separate_runs_carries_every_scenario_forward(bench_run, tmp_path):
    older = _report("2026-01-01T00:00:00+00:00", "aaaaaaa", {"drain one": 1.0, "defaults sweep": 3.0})
    older["separate_runs"] = {"dagster_order": _report("2025-12-31T00:00:00+00:00", "9999999", {"order p99": 40.0})}
    (tmp_path / "results.json").write_text(json.dumps(older))
    (tmp_path / "results.md").write_text("notes written before the title was fixed\n")

    bench_run.write_results(
        _report("2026-03-03T00:00:00+00:00", "ccccccc", {"defaults sweep": 2.5}),
        tmp_path,
        "results",
        tmp_path / "archive",
    )

    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results["earlier"]) == ["drain", "order"]
    assert results["earlier"]["order"]["git_commit"] == "9999999"
    assert results["earlier"]["drain"]["timestamp"] == "2026-01-01T00:00:00+00:00"
    markdown = (tmp_path / "results.md").read_text()
    assert markdown.startswith("# outbox_pipelines benchmark results\n")
    assert markdown.endswith("notes written before the title was fixed\n")
