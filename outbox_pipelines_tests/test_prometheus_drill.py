"""The alert rules evaluated live: a real Prometheus server (Debian's ``prometheus``) scrapes a real relay's /metrics
on 127.0.0.1 while its HTTP destination answers 503, and OutboxCircuitOpen fires at /api/v1/alerts, nothing else;
the destination answers again, and it resolves. The rules are deploy/prometheus/outbox-rules.yml with each `for`
in seconds instead of minutes. Also: where /metrics listens (--metrics-host, OUTBOX_METRICS_HOST)."""

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.processes import free_port, start_cli, start_logged, stop_process, tail, wait_until
from outbox_pipelines_tests.sink import HttpSink

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "outbox-rules.yml"
TABLE = "drill_outbox"
PROMETHEUS_HINT = (
    "prometheus is not installed: `apt-get install --no-install-recommends prometheus` (Debian/Ubuntu), "
    "or run `bash .ci/run`, which installs it where it is missing"
)


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if found is None:
        pytest.fail(PROMETHEUS_HINT, pytrace=False)
    return found


def firing(prometheus: str) -> list[dict[str, Any]] | None:
    try:
        answer = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5)
    except httpx.TransportError:
        return None
    return [a for a in answer.json()["data"]["alerts"] if a["state"] == "firing"] if answer.status_code == 200 else None


def test_a_destination_down_fires_circuit_open_at_a_real_prometheus_and_resolves(cli_env, conn, tmp_path):
    down = {"now": True}
    sink = HttpSink(script=lambda key, attempt, body: (503, {}, b"down") if down["now"] else None).start()
    config = tmp_path / "outbox.toml"
    config.write_text(
        f'[tables.{TABLE}]\ndestination = "http"\nurl = "{sink.url}"\nmax_attempts = 1000\n'
        'circuit_threshold = 3\nprobe_interval = "1s"\nbase = "1s"\nmax_backoff = "2s"\n'
    )
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    assert run_cli(env, "db", "create-table", TABLE).returncode == 0
    Outbox(TABLE).enqueue_many(conn, [Message(topic="t", payload={"n": i}) for i in range(5)], outside_transaction=True)
    # The rules as shipped, each `for: Nm` made `for: Ns`, evaluated every second on a scrape a second.
    (tmp_path / "rules.yml").write_text(re.sub(r"for: (\d+)m\b", r"for: \1s", RULES.read_text()))
    metrics_port, prometheus_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [rules.yml]\n"
        f"scrape_configs: [{{job_name: outbox, static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]}}]\n"
    )
    relay = start_cli(
        env, "relay", "--table", TABLE, "--quiet", "--max-seconds", "120",
        "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1",
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    log = tmp_path / "prometheus.log"
    server = start_logged(
        [
            prometheus_binary(),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        log,
        env=cli_env,
        cwd=tmp_path,
    )
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    try:
        alerts = wait_until(
            lambda: [a for a in firing(prometheus) or [] if a["labels"]["alertname"] == "OutboxCircuitOpen"],
            90,
            "OutboxCircuitOpen firing at Prometheus",
            on_timeout=lambda: tail(log),
            process=relay,
        )
        [alert] = alerts
        assert alert["labels"] == {"alertname": "OutboxCircuitOpen", "severity": "critical", "table": TABLE}
        assert TABLE in alert["annotations"]["summary"]
        assert alert["annotations"]["runbook_url"] == "docs/how-to/prometheus.md#outboxcircuitopen"
        # Nothing else: the table is read (state_up), its relay is alive, nothing is dead or blocked yet.
        assert {a["labels"]["alertname"] for a in firing(prometheus) or []} == {"OutboxCircuitOpen"}
        down["now"] = False  # the destination answers again: the next probe closes the circuit
        wait_until(lambda: firing(prometheus) == [], 60, "the alert resolved", on_timeout=lambda: tail(log))
        assert sink.keys(), "the relay delivered once the destination was back"
    finally:
        stop_process(server)
        stop_process(relay)
        sink.stop()


def test_metrics_listen_where_outbox_metrics_host_says_and_a_bad_one_is_refused(cli_env):
    port = free_port()
    refused = run_cli({**cli_env, "OUTBOX_METRICS_HOST": "999.1.1.1"}, "metrics", "--port", str(port))
    assert refused.returncode == 2 and "OUTBOX_METRICS_HOST: '999.1.1.1' is not an address" in refused.stderr
    exporter = start_cli({**cli_env, "OUTBOX_METRICS_HOST": "127.0.0.1"}, "metrics", "--port", str(port))
    try:
        said = wait_until(lambda: exporter.stderr.readline(), 60, "the exporter's first line", process=exporter)
        assert f"on http://127.0.0.1:{port}/metrics" in said
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    finally:
        assert stop_process(exporter) == 0


def test_a_relay_group_serves_the_state_of_each_of_its_tables(cli_env):
    port = free_port()
    group = start_cli(cli_env, "relay", "--group", "default", "--quiet", "--metrics-port", str(port))
    try:
        text = wait_until(lambda: _served(port), 60, "the group's /metrics", process=group)
    finally:
        stop_process(group)
    up = dict(re.findall(r'outbox_state_up\{table="([a-z_]+)"\} ([0-9.]+)', text))
    assert up.get("outbox_events") == "1.0", text


def _served(port: int) -> str | None:
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.TransportError:
        return None
    return answer.text if "outbox_state_up{" in answer.text else None
