"""deploy/grafana/outbox-dashboard.json: what deploy/grafana/build_dashboard.py writes, laid out on Grafana's
24-column grid with unique ids, every query on the dashboard's Prometheus variable; each query valid PromQL
(``promtool check rules``, Debian's ``prometheus`` package) and naming only metrics, with the labels it groups
by, that a real ``outbox-pipelines relay --metrics-port`` serves after relaying messages."""

import importlib.util
import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from outbox_pipelines_tests.helpers import enqueue_n
from outbox_pipelines_tests.processes import free_port, start_cli, start_relay, stop_process, wait_until

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "outbox-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PROMTOOL_HINT = (
    "promtool is not installed: `apt-get install --no-install-recommends prometheus` (Debian/Ubuntu), "
    "or run `bash .ci/run`, which installs it where it is missing"
)

# PromQL words that are not metric names: aggregations and functions are followed by "(", these are not.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
IDENTIFIER = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", GRAFANA / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def query_panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def exprs() -> list[tuple[str, str]]:
    """(panel title and refId, expr) of every query on the dashboard."""
    return [(f"{p['title']} {t['refId']}", t["expr"]) for p in query_panels() for t in p["targets"]]


def as_promql(expr: str) -> str:
    """The expr as Prometheus gets it from Grafana: the rate interval and the table variable (All) filled in."""
    filled = expr.replace("$__rate_interval", "5m").replace('"$table"', '".*"')
    assert "$" not in filled, f"a Grafana variable this test does not fill in: {filled}"
    return filled


def metrics_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The metric names ``expr`` reads and the label names it matches or groups on."""
    labels = {name.strip() for _, names in LABEL_LISTS.findall(expr) for name in names.split(",") if name.strip()}
    labels |= {name for matchers in MATCHERS.findall(expr) for name, _ in MATCHER_LABEL.findall(matchers)}
    bare = re.sub(r'"[^"]*"', "", MATCHERS.sub("", LABEL_LISTS.sub("", expr)))
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    names = {word for word in IDENTIFIER.findall(bare) if word not in KEYWORDS and not word.startswith("$")}
    return names, labels


def test_the_extraction_finds_metrics_and_labels_not_functions_or_label_values():
    expr = (
        'sum by (table) (rate(a_total{table=~"$table", result="dead"}[5m])) * on (table) group_left (destination) '
        'max by (table, destination) (b_info) + histogram_quantile(0.5, sum by (le) (rate(c_bucket{x="y_z"}[1m])))'
    )
    assert metrics_and_labels(expr) == (
        {"a_total", "b_info", "c_bucket"},
        {"table", "result", "destination", "le", "x"},
    )


def test_the_json_is_what_the_script_writes():
    module = build_module()
    assert DASHBOARD.read_text() == module.rendered(), "rerun: .venv/bin/python deploy/grafana/build_dashboard.py"
    assert module.main(["--check"]) == 0


def test_the_dashboard_is_a_classic_grafana_dashboard_with_its_two_variables():
    board = dashboard()
    assert board["schemaVersion"] == 39 and board["uid"] and board["title"] and board["id"] is None
    assert {"from", "to"} <= board["time"].keys() and board["refresh"]
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    table = variables["table"]
    assert table["type"] == "query" and table["datasource"] == DATASOURCE
    assert table["query"] == "label_values(outbox_pending_count, table)" and table["multi"] and table["includeAll"]


def test_panels_have_unique_ids_and_do_not_overlap_on_the_grid():
    panels = dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for cell in itertools.product(range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])):
            assert cell not in cells, f"{panel['title']!r} overlaps {cells[cell]!r} at {cell}"
            cells[cell] = panel["title"]
    kinds = {panel["type"] for panel in panels}
    assert {"row", "table", "timeseries"} <= kinds


def test_every_query_reads_the_datasource_variable_and_the_table_variable():
    for panel in query_panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and panel["title"] and panel["description"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == DATASOURCE, (panel["title"], t["refId"])
            selectors = re.findall(r"\b(outbox_\w+)(\{[^}]*\})?", t["expr"])
            assert selectors and all('table=~"$table"' in matchers for _, matchers in selectors), t["expr"]


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail(PROMTOOL_HINT, pytrace=False)
    return found


def test_every_query_is_valid_promql(tmp_path):
    rules = [{"record": f"dashboard:query_{i}", "expr": as_promql(expr)} for i, (_, expr) in enumerate(exprs())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    checked = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def scrape(port: int) -> str:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return ""


def samples(text: str) -> dict[str, set[str]]:
    """Each sample name served (``_bucket``, ``_total``… as Prometheus stores them) → the labels it has."""
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    return served


def test_every_metric_the_dashboard_reads_is_served_by_a_real_relay(cli_env, conn):
    """Delivered, retried and dead messages through a relay, then its /metrics: a metric renamed in the code,
    or a label dropped, fails here rather than leaving a panel empty."""
    enqueue_n(conn, "outbox_events", 5, topic="org.changed", payload=lambda i: {"org_id": i})
    enqueue_n(conn, "outbox_events", 1, topic="org.changed", prefix="dead", payload=lambda i: {})
    enqueue_n(conn, "outbox_events", 1, topic="demo.flaky", prefix="flaky")
    port = free_port()
    relay = start_relay(cli_env, "outbox_events", "--max-seconds", "60", "--metrics-port", str(port))
    try:

        def settled() -> str:
            text = scrape(port)
            return text if all(f'result="{result}"' in text for result in ("success", "retry", "dead")) else ""

        served = samples(wait_until(settled, 60, "the relay's /metrics counting sent, retried and dead", process=relay))
    finally:
        stop_process(relay, grace_s=20)

    missing = []
    for where, expr in exprs():
        names, labels = metrics_and_labels(expr)
        assert names, f"{where}: no metric found in {expr}"
        for name in sorted(names - served.keys()):
            missing.append(f"{where}: {name} is not served")
        labelled = set().union(*(served.get(name, set()) for name in names))
        for label in sorted(labels - labelled):
            missing.append(f"{where}: no metric of {sorted(names)} has the label {label}")
    assert not missing, "\n".join(missing)


def test_the_tables_now_panel_needs_only_the_exporter(cli_env, conn):
    """Relays run by Dagster serve no /metrics: ``outbox-pipelines metrics`` alone fills the overview table."""
    enqueue_n(conn, "outbox_events", 2, topic="org.changed", payload=lambda i: {"org_id": i})
    port = free_port()
    exporter = start_cli(cli_env, "metrics", "--port", str(port), "--table", "outbox_events")

    def serving() -> str:
        text = scrape(port)
        return text if "outbox_pending_count{" in text else ""

    try:
        text = wait_until(serving, 30, "the exporter's /metrics", process=exporter)
    finally:
        stop_process(exporter, grace_s=20)
    served = samples(text)
    assert served["outbox_pending_count"] >= {"table"}
    overview = next(panel for panel in query_panels() if panel["type"] == "table")
    read = set().union(*(metrics_and_labels(t["expr"])[0] for t in overview["targets"]))
    assert len(read) == len(overview["targets"]) and not read - served.keys(), sorted(read - served.keys())
