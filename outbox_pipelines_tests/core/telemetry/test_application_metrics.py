"""Issue 22: an application serves ``outbox_enqueue_total{table,topic}`` of its own enqueues.

Before, the counter lived only in the outbox's private registry, which nothing but the Order API's
/metrics served, so a service's own enqueues were invisible to Prometheus. Each case is the team's own
process (a script in a project directory of its own) that enqueues in its business transaction and
exposes the metrics the way docs/how-to/write-messages.md says; the test scrapes them over a real socket.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from outbox_pipelines_tests.processes import free_port, kill_process, wait_until

APP = """
import os, sys, time
import psycopg
import outbox_pipelines
from outbox_pipelines import Message, Outbox

port = int(sys.argv[1])
{expose}
outbox = Outbox("outbox_events")
with psycopg.connect(os.environ["OUTBOX_DATABASE_URL"]) as conn:  # one business transaction
    conn.execute("CREATE TEMP TABLE orgs (id int)")
    conn.execute("INSERT INTO orgs VALUES (42)")
    for n in range(3):
        outbox.enqueue(conn, Message(topic="org.changed", payload={{"org_id": n}}))
    outbox.enqueue_many(conn, [Message(topic="member.joined", payload={{"n": n}}) for n in range(25)])
print("ready", flush=True)
time.sleep(120)
"""

WAYS = {
    # the outbox's own server on a port of its own
    "serve_metrics": "outbox_pipelines.serve_metrics(port)",
    # the application's /metrics already serves prometheus_client's default registry
    "expose_metrics": textwrap.dedent("""
        import prometheus_client
        outbox_pipelines.expose_metrics()
        prometheus_client.Counter("app_requests_total", "the app's own").inc()
        prometheus_client.start_http_server(port, addr="127.0.0.1")
    """),
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_application_serves_its_enqueue_counts(cli_env, conn, tmp_path: Path, way: str):
    script = tmp_path / "billing_app.py"
    script.write_text(APP.format(expose=WAYS[way]))
    port = free_port()
    app = subprocess.Popen(
        [sys.executable, str(script), str(port)],
        env=cli_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert app.stdout.readline().strip() == "ready", app.stderr.read() if app.poll() is not None else ""
        text = wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/metrics").text, 10, "the /metrics endpoint")
    finally:
        kill_process(app)
    assert 'outbox_enqueue_total{table="outbox_events",topic="org.changed"} 3.0' in text, text
    assert 'outbox_enqueue_total{table="outbox_events",topic="member.joined"} 25.0' in text
    if way == "expose_metrics":
        assert "app_requests_total 1.0" in text  # beside the application's own metrics, in one scrape
    assert conn.execute("SELECT count(*) AS n FROM outbox_events").fetchone()["n"] == 28
