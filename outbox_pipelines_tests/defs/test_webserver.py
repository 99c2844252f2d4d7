"""Smoke test: the real dagster-webserver on loopback finds everything, launches a relay run, and it succeeds."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.processes import free_port, stop_process

pytestmark = pytest.mark.slow  # a real dagster-webserver process per test

REPOSITORY = """
query {
  repositoriesOrError {
    ... on RepositoryConnection {
      nodes { name location { name } jobs { name } schedules { name } sensors { name } }
    }
  }
  assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name canExecuteIndividually } } } }
}
"""
LAUNCH = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
RUN = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status tags { key value } } } }"
TERMINATE = """
mutation($id: String!) { terminateRun(runId: $id) { __typename ... on PythonError { message } } }
"""


def _start_webserver(env: dict[str, str]) -> tuple["subprocess.Popen[str]", str]:
    """dagster-webserver on a free port, once it answers; a port taken between the draw and the bind (another test's
    server) is drawn again."""
    for _ in range(3):
        port = free_port()
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster-webserver"),
                "-m",
                "outbox_pipelines.definitions",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/server_info", timeout=1).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                time.sleep(0.5)
        stop_process(proc, grace_s=20, group=True)
        error = proc.stderr.read() if proc.stderr else ""
        if "address already in use" not in error:
            raise AssertionError(f"dagster-webserver did not start: {error}")
    raise AssertionError("dagster-webserver found its port taken three times")


@pytest.fixture
def webserver(db_url, tmp_path):
    # No daemon here: the webserver launches runs itself.
    (tmp_path / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "OUTBOX_DATABASE_URL": db_url}
    proc, url = _start_webserver(env)
    yield url
    stop_process(proc, grace_s=20, group=True)


def graphql(url: str, query: str, **variables):
    response = httpx.post(url + "/graphql", json={"query": query, "variables": variables}, timeout=60)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def test_webserver_serves_the_code_location_and_runs_a_relay(webserver, conn):
    data = graphql(webserver, REPOSITORY)
    [repo] = data["repositoriesOrError"]["nodes"]
    jobs = {j["name"] for j in repo["jobs"]}
    assert {"relay_group_default_job", "relay_job", "replay_dead_job", "backfill_job", "outbox_checks_job"} <= jobs
    assert "relay_group_default_every_30_minutes" in {s["name"] for s in repo["schedules"]}
    assert {"relay_group_default_on_backlog", "outbox_run_failure_alert", "outbox_oncall"} <= {
        s["name"] for s in repo["sensors"]
    }
    checks = {
        tuple(n["assetKey"]["path"]): {
            c["name"]: c["canExecuteIndividually"] for c in n["assetChecksOrError"]["checks"]
        }
        for n in data["assetNodes"]
    }
    # every check can be executed from the asset's Checks tab (no materialization needed)
    assert checks[("outbox", "outbox_events")] == dict.fromkeys(
        ["lag", "dead_letters", "stuck", "backlog", "destination", "relay", "blocked_keys", "vacuum"], "CAN_EXECUTE"
    )

    enqueue_n(conn, "outbox_events", 5, topic="org.changed", payload=lambda i: {"org_id": i})
    params = {
        "selector": {
            "repositoryLocationName": repo["location"]["name"],
            "repositoryName": repo["name"],
            "jobName": "relay_job",
        },
        "runConfigData": {"ops": {"relay_table": {"config": {"table": "outbox_events", "once": True}}}},
    }
    launched = graphql(webserver, LAUNCH, params=params)["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        status = graphql(webserver, RUN, id=run_id)["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(0.5)
    assert status == "SUCCESS"
    assert statuses(conn, "outbox_events") == {"sent": 5}


def wait_status(url: str, run_id: str, wanted: tuple[str, ...], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = graphql(url, RUN, id=run_id)["runOrError"]["status"]
        if status in wanted:
            return status
        time.sleep(0.3)
    return status


def test_terminate_in_the_ui_cancels_a_relay_run_after_it_settles(webserver, conn):
    """The UI's Terminate ends a relay run CANCELED (not FAILURE), with its batch settled."""
    repo = graphql(webserver, REPOSITORY)["repositoriesOrError"]["nodes"][0]
    enqueue_n(conn, "outbox_events", 3, topic="org.changed", payload=lambda i: {"org_id": i})
    params = {
        "selector": {
            "repositoryLocationName": repo["location"]["name"],
            "repositoryName": repo["name"],
            "jobName": "relay_job",
        },
        "runConfigData": {"ops": {"relay_table": {"config": {"table": "outbox_events", "max_seconds": 600}}}},
    }
    run_id = graphql(webserver, LAUNCH, params=params)["launchRun"]["run"]["runId"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and statuses(conn, "outbox_events") != {"sent": 3}:
        time.sleep(0.3)
    assert statuses(conn, "outbox_events") == {"sent": 3}
    assert graphql(webserver, TERMINATE, id=run_id)["terminateRun"]["__typename"] == "TerminateRunSuccess"
    assert wait_status(webserver, run_id, ("SUCCESS", "FAILURE", "CANCELED")) == "CANCELED"
    [worker] = conn.execute("SELECT * FROM outbox_relay_workers WHERE run_id = %s", (run_id,)).fetchall()
    assert worker["stopped_at"] is not None and worker["stop_reason"] == "stop requested"
    assert conn.execute("SELECT count(*) AS n FROM outbox_events WHERE status = 'sending'").fetchone()["n"] == 0


ATTEMPTED_OVERRIDES = [
    {"outbox_destinations": {"config": {"url_overrides": {"outbox_memory": "{sink}"}}}},
    {"outbox_db": {"config": {"url": "postgresql://attacker@127.0.0.1:9/stolen"}}},
    {"outbox_db": {"config": {"config_path": "/tmp/attacker-outbox.toml"}}},
]


def test_a_launch_from_the_ui_cannot_redirect_messages_or_the_database(webserver, conn, http_sink):
    """Issue 22: anyone who can open the UI (it has no login) could send a table's messages, with the broker's
    token, to a URL of their choice by run config, and the rows were marked sent. The launch is refused now."""
    repo = graphql(webserver, REPOSITORY)["repositoriesOrError"]["nodes"][0]
    enqueue_n(conn, "outbox_memory", 3)
    for resources in ATTEMPTED_OVERRIDES:
        params = {
            "selector": {
                "repositoryLocationName": repo["location"]["name"],
                "repositoryName": repo["name"],
                "jobName": "relay_job",
            },
            "runConfigData": {
                "resources": json.loads(json.dumps(resources).replace("{sink}", http_sink.url)),
                "ops": {"relay_table": {"config": {"table": "outbox_memory", "once": True}}},
            },
        }
        launched = graphql(webserver, LAUNCH, params=params)["launchRun"]
        assert launched["__typename"] == "RunConfigValidationInvalid", (resources, launched)
        assert any("unexpected config entry" in e["message"].lower() for e in launched["errors"]), launched
    assert http_sink.received == [] and statuses(conn, "outbox_memory") == {"pending": 3}


def test_terminate_in_the_ui_cancels_a_group_run_with_every_tables_batch_settled(webserver, conn):
    """Issue 23: a group run relays many tables; Terminate settles each one's batch in flight and ends CANCELED."""
    repo = graphql(webserver, REPOSITORY)["repositoriesOrError"]["nodes"][0]
    enqueue_n(conn, "outbox_events", 3, topic="org.changed", payload=lambda i: {"org_id": i})
    enqueue_n(conn, "outbox_memory", 4)
    params = {
        "selector": {
            "repositoryLocationName": repo["location"]["name"],
            "repositoryName": repo["name"],
            "jobName": "relay_group_default_job",
        },
        "runConfigData": {"ops": {"relay_group": {"config": {"group": "default", "max_seconds": 600}}}},
    }
    run_id = graphql(webserver, LAUNCH, params=params)["launchRun"]["run"]["runId"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (statuses(conn, "outbox_events"), statuses(conn, "outbox_memory")) != (
        {"sent": 3},
        {"sent": 4},
    ):
        time.sleep(0.3)
    assert (statuses(conn, "outbox_events"), statuses(conn, "outbox_memory")) == ({"sent": 3}, {"sent": 4})
    assert graphql(webserver, TERMINATE, id=run_id)["terminateRun"]["__typename"] == "TerminateRunSuccess"
    assert wait_status(webserver, run_id, ("SUCCESS", "FAILURE", "CANCELED")) == "CANCELED"
    tags = {t["key"]: t["value"] for t in graphql(webserver, RUN, id=run_id)["runOrError"]["tags"]}
    assert tags["outbox/outcome"] == "cancelled" and tags["outbox/group"] == "default"
    assert (
        conn.execute(
            "SELECT count(*) AS n FROM outbox_relay_workers WHERE run_id = %s AND stopped_at IS NULL", (run_id,)
        ).fetchone()["n"]
        == 0
    )  # every table's relay said goodbye
