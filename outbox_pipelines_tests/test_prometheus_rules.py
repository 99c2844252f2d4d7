"""deploy/prometheus/outbox-rules.yml: valid and unit-tested by promtool (Debian's ``prometheus``; each alert fires,
stays silent on a quiet and on a drained table, and resolves: outbox-rules.test.yml); each with a severity, a summary
naming only the table, a runbook section that exists; reading only metrics a real exporter serves. The Helm files:
the same rules (``python outbox_pipelines_tests/test_prometheus_rules.py`` writes them), a scraped exporter."""

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "outbox-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "outbox-rules.test.yml"
PROMETHEUS_RULE = ROOT / "deploy" / "helm" / "prometheus-rule.yaml"
SERVICE_MONITOR = ROOT / "deploy" / "helm" / "servicemonitor.yaml"
RUNBOOK = ROOT / "docs" / "how-to" / "prometheus.md"
PROMTOOL_HINT = (
    "promtool is not installed: `apt-get install --no-install-recommends prometheus` (Debian/Ubuntu), "
    "or run `bash .ci/run`, which installs it where it is missing"
)
PROMETHEUS_RULE_HEADER = """\
# The alert rules of deploy/prometheus/outbox-rules.yml for the Prometheus Operator (kube-prometheus-stack):
#
#   kubectl -n outbox apply -f deploy/helm/prometheus-rule.yaml
#
# Generated: `python outbox_pipelines_tests/test_prometheus_rules.py` rewrites it from the rules file, and the
# test fails while the two differ. Applied as it is, not through Helm (whose templating would take the
# {{ $labels.table }} of the summaries for its own). Give it the label your Prometheus's ruleSelector matches
# (kube-prometheus-stack: release: <its release name>). What each alert means: docs/how-to/prometheus.md.
"""
METRIC = re.compile(r"\b(outbox_[a-z_]+|messaging_[a-z_]+)\b")


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail(PROMTOOL_HINT, pytrace=False)
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rendered_prometheus_rule() -> str:
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "outbox-pipelines", "labels": {"app.kubernetes.io/name": "outbox-pipelines"}},
        "spec": {"groups": yaml.safe_load(RULES.read_text())["groups"]},
    }
    return PROMETHEUS_RULE_HEADER + yaml.safe_dump(resource, sort_keys=False, width=120)


def test_promtool_checks_the_rules_and_every_alert_passes_its_tests():
    check = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rules())} rules found" in check.stdout
    tested = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_firing_then_silent_again():
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for rule in rules():
        checks = [c for case in cases for c in case["alert_rule_test"] if c["alertname"] == rule["alert"]]
        times = [(int(c["eval_time"].rstrip("m")), bool(c["exp_alerts"])) for c in checks]
        firing = [t for t, fires in times if fires]
        assert firing, f"{rule['alert']}: no test where it fires"
        assert any(t < min(firing) and not fires for t, fires in times), f"{rule['alert']}: not silent before"
        assert any(t > max(firing) and not fires for t, fires in times), f"{rule['alert']}: never resolves"


def test_every_alert_has_a_severity_a_summary_by_table_and_a_runbook_section():
    anchors = {
        re.sub(r"[^a-z0-9_-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        summary = rule["annotations"]["summary"]
        assert set(re.findall(r"{{[^}]*}}", summary)) <= {"{{ $labels.table }}"}, rule["alert"]
        page, anchor = rule["annotations"]["runbook_url"].split("#")
        assert page == "docs/how-to/prometheus.md" and anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no section {anchor!r} in {RUNBOOK.relative_to(ROOT)}"


def test_every_metric_the_rules_read_is_served_by_the_exporter(cli_env, conn):
    from outbox_pipelines_tests.helpers import enqueue_n
    from outbox_pipelines_tests.processes import free_port, start_cli, stop_and_read, wait_until

    enqueue_n(conn, "outbox_events", 3)  # waiting: the lag quantiles have a value
    port = free_port()
    exporter = start_cli(cli_env, "metrics", "--port", str(port), "--table", "outbox_events")
    try:
        text = wait_until(lambda: _scrape(port), 60, "the exporter's /metrics", process=exporter)
    finally:
        code, _, err = stop_and_read(exporter)
    assert code == 0, err
    served = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    assert {"outbox_state_up", "outbox_relay_enabled", "outbox_relays_alive"} <= served
    read = {name for rule in rules() for name in METRIC.findall(rule["expr"])}
    assert read and read <= served, f"the rules read metrics the exporter does not serve: {read - served}"


def test_every_metric_served_is_documented():
    from outbox_pipelines.core.oncall.table_metrics import OutboxStateCollector
    from outbox_pipelines.core.telemetry import metrics

    # What the relay and the enqueue count (not REGISTRY.collect(): a table collector there reads a database),
    # and the table gauges' families.
    families = list(metrics.Counted().collect())
    families += OutboxStateCollector("postgresql:///never-read", []).collect()
    names = {family.name + ("_total" if family.type == "counter" else "") for family in families}
    outbox = {name for name in names if name.startswith(("outbox_", "messaging_"))}
    documented = set(re.findall(r"`((?:outbox|messaging)_[a-z_]+)`", RUNBOOK.read_text()))
    assert outbox and not outbox - documented, f"not in {RUNBOOK.relative_to(ROOT)}: {sorted(outbox - documented)}"


def _scrape(port: int) -> str | None:
    import httpx

    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.TransportError:
        return None
    return answer.text if answer.status_code == 200 and "outbox_state_up{" in answer.text else None


def test_the_helm_prometheus_rule_holds_the_same_rules():
    assert PROMETHEUS_RULE.read_text() == rendered_prometheus_rule(), (
        "rerun: .venv/bin/python outbox_pipelines_tests/test_prometheus_rules.py"
    )


def test_the_service_monitor_scrapes_the_exporter_its_service_exposes():
    from outbox_pipelines.cli import build_parser

    deployment, service, monitor = yaml.safe_load_all(SERVICE_MONITOR.read_text())
    assert (deployment["kind"], service["kind"], monitor["kind"]) == ("Deployment", "Service", "ServiceMonitor")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert container["command"][:2] == ["outbox-pipelines", "metrics"] and args.host == "0.0.0.0"
    [container_port] = container["ports"]
    assert container_port["containerPort"] == args.port
    [port] = service["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == container_port["name"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(rendered_prometheus_rule())
    sys.stdout.write(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}\n")
