"""README "Add an outbox to your service", run as written: every command of its block, in order, in a copy of
examples/billing_service outside this repository (a project with its own pyproject.toml, package, business
tables, handlers module and defs.yaml), with this environment's `dg` and `outbox-pipelines` on PATH.

The step the README tells in words ("edit its tables") is done by copying the example's defs.yaml over the
scaffolded one; the install step is this test environment's (outbox_pipelines installed, the service run
from its root as dg runs it, never on PYTHONPATH).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines_tests.helpers import stop_project_server
from outbox_pipelines_tests.sink import HttpSink

pytestmark = pytest.mark.slow  # a project of its own: dg, dagster and the CLI as processes

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "billing_service"
SECTION = "## Add an outbox to your service"
TABLES = ["billing_outbox", "billing_receipts_outbox"]
# Each declared table is an asset, and so is the schema they share (its version and drift checks).
ASSET_KEYS = [*(f"outbox/{t}" for t in TABLES), "outbox_schema"]


def walkthrough_commands() -> list[str]:
    """The README section's bash block, a command a line."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the walkthrough's bash block is gone from the README"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "billing_service"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__", ".outbox", "*.egg-info"))
    shutil.rmtree(root / "billing_service" / "defs" / "outbox")  # the walkthrough scaffolds its own
    return root


def adopter_env(tmp_path: Path, db_url: str | None, webhook: str) -> dict[str, str]:
    """The team's shell: this environment's tools on PATH, their webhook, and OUTBOX_DATABASE_URL unless
    ``db_url`` is None (nothing set: the project's embedded server)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_", "PYTHONPATH"))}
    return {
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        **({"OUTBOX_DATABASE_URL": db_url} if db_url else {}),
        "BILLING_WEBHOOK_URL": webhook,
        "DAGSTER_HOME": str(home),
    }


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(params=["OUTBOX_DATABASE_URL", "embedded, asked for"])
def walkthrough_database(request: pytest.FixtureRequest, project: Path) -> Iterator[str | None]:
    """The database the walkthrough runs on: a test database named by OUTBOX_DATABASE_URL, or (README step 3) the
    project's embedded server, asked for with `mkdir .outbox` and stopped at the end."""
    if request.param == "OUTBOX_DATABASE_URL":
        yield request.getfixturevalue("db_url")
        return
    (project / ".outbox").mkdir()
    yield None
    stop_project_server(project / ".outbox")


@pytest.mark.timeout(900)
def test_the_readme_walkthrough_takes_a_service_of_its_own_to_a_delivered_message(
    tmp_path, project, walkthrough_database
):
    sink = HttpSink().start()
    try:
        env = adopter_env(tmp_path, walkthrough_database, f"{sink.url}invoices")
        timings: list[tuple[str, float]] = []
        for command in walkthrough_commands():
            started = time.monotonic()
            done = run(command, project, env)
            timings.append((command[:60], time.monotonic() - started))
            if command.startswith("dg scaffold defs"):
                scaffolded = project / "billing_service" / "defs" / "billing" / "defs.yaml"
                assert "type: outbox_pipelines.OutboxComponent" in scaffolded.read_text()
                assert "billing_outbox" in scaffolded.read_text()
                # "edit its tables": the example's declaration
                shutil.copy(EXAMPLE / "billing_service" / "defs" / "outbox" / "defs.yaml", scaffolded)
        total = sum(seconds for _, seconds in timings)
        print("walkthrough:", ", ".join(f"{c} {s:.1f}s" for c, s in timings), f"total {total:.0f}s")
        assert sink.counts == {"invoice-1": 1}, sink.counts
        db_url = walkthrough_database or run("outbox-pipelines db url", project, env).stdout.strip()
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT event_id FROM receipts").fetchall() == [("receipt-1",)]
            for table in TABLES:
                assert conn.execute(f"SELECT status FROM {table}").fetchall() == [("sent",)]
        status = done.stdout  # the last command: outbox-pipelines status
        assert all(re.search(rf"^{t}\s+0\s+0\s+0\s+1\s+0", status, re.M) for t in TABLES), status
    finally:
        sink.stop()


def test_the_project_gets_exactly_its_own_tables_and_the_cli_reads_them_from_a_sub_directory(tmp_path, project, db_url):
    shutil.copytree(EXAMPLE / "billing_service" / "defs" / "outbox", project / "billing_service" / "defs" / "outbox")
    env = adopter_env(tmp_path, db_url, "http://127.0.0.1:9/hook")
    listed = json.loads(run("dg list defs --json", project, env).stdout)
    keys = sorted(asset["asset_key"] for asset in listed["assets"])
    assert keys == ASSET_KEYS, keys
    deep = project / "billing_service" / "defs"
    upgraded = run("outbox-pipelines db upgrade", deep, env)
    assert all(f"created outbox table {table}" in upgraded.stdout for table in TABLES), upgraded.stdout
    status = run("outbox-pipelines status --json", deep, env).stdout
    assert sorted(row["table"] for row in json.loads(status)) == TABLES, status
    assert not (deep / ".outbox").exists()


def test_two_teams_components_in_one_project_load_together_and_may_not_share_a_table(tmp_path, project, db_url):
    """Two OutboxComponents (one per team) in one project: one code location with both tables, one relay group
    job over both, and the CLI reads both; a table declared in both is refused naming both files."""
    defs = project / "billing_service" / "defs"
    both = (EXAMPLE / "billing_service" / "defs" / "outbox" / "defs.yaml").read_text()
    head, receipts = both.split("    # receipts written")
    (defs / "invoices").mkdir()
    (defs / "invoices" / "defs.yaml").write_text(head)
    (defs / "receipts").mkdir()
    (defs / "receipts" / "defs.yaml").write_text(
        "type: outbox_pipelines.OutboxComponent\nattributes:\n  tables:\n    # receipts written" + receipts
    )
    env = adopter_env(tmp_path, db_url, "http://127.0.0.1:9/hook")
    run("dg check defs", project, env)
    listed = json.loads(run("dg list defs --json", project, env).stdout)
    assert sorted(a["asset_key"] for a in listed["assets"]) == ASSET_KEYS
    group_job = next(j for j in listed["jobs"] if j["name"] == "relay_group_default_job")
    assert all(t in group_job["description"] for t in TABLES), group_job
    upgraded = run("outbox-pipelines db upgrade", project, env)
    assert f"outbox tables of this project (billing_service): {', '.join(TABLES)}" in upgraded.stdout, upgraded.stdout

    (defs / "receipts" / "defs.yaml").write_text(
        (defs / "receipts" / "defs.yaml").read_text() + head.split("tables:")[1]
    )
    check = subprocess.run(["dg", "check", "defs"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode != 0
    said = check.stdout + check.stderr
    assert "table 'billing_outbox' is declared in" in said and "declare each table in one OutboxComponent" in said
    status = subprocess.run(
        ["outbox-pipelines", "status"], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 2 and "invoices/defs.yaml" in status.stderr and "receipts/defs.yaml" in status.stderr


def test_a_handlers_module_that_does_not_import_fails_dg_check_and_leaves_only_that_table_out(
    tmp_path, project, db_url
):
    declared = project / "billing_service" / "defs" / "outbox"
    shutil.copytree(EXAMPLE / "billing_service" / "defs" / "outbox", declared)
    yaml_file = declared / "defs.yaml"
    yaml_file.write_text(
        yaml_file.read_text().replace("billing_service.handlers:registry", "billing_service.handler:registry")
    )
    env = adopter_env(tmp_path, db_url, "http://127.0.0.1:9/hook")
    check = subprocess.run(["dg", "check", "defs"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    said = check.stdout + check.stderr
    assert check.returncode != 0
    assert (
        "[tables.billing_receipts_outbox] handlers = 'billing_service.handler:registry': cannot import "
        "billing_service.handler"
    ) in said, said[-3000:]
    assert "pip install -e ." in said
    # Loaded to run (dg dev, the code server): the other table relays; no job or sensor for the broken one.
    listed = json.loads(run("dg list defs --json", project, env).stdout)
    assert sorted(a["asset_key"] for a in listed["assets"]) == ASSET_KEYS
    group_job = next(j for j in listed["jobs"] if j["name"] == "relay_group_default_job")
    assert "billing_outbox" in group_job["description"] and "billing_receipts_outbox" not in group_job["description"]


@pytest.mark.timeout(600)
def test_the_demo_runs_beside_the_teams_own_tables(tmp_path, project, db_url):
    shutil.copytree(EXAMPLE / "billing_service" / "defs" / "outbox", project / "billing_service" / "defs" / "outbox")
    env = adopter_env(tmp_path, db_url, "http://127.0.0.1:9/hook")
    demo = subprocess.run(
        ["outbox-pipelines", "demo"], cwd=project, env=env, capture_output=True, text=True, timeout=500
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert re.search(r"^outbox_orders\s+0\s+0\s+0\s+12\s+1", demo.stdout, re.M), demo.stdout
    assert "billing_outbox" not in demo.stdout  # the demo's tables, not the team's


@pytest.mark.timeout(600)
def test_a_run_started_from_a_workspace_s_directory_relays_the_project_s_tables(tmp_path, project, db_url):
    """A Dagster workspace loads the project with its own working_directory, and its run workers start in the
    workspace's directory: the tables are still the project's (its pyproject.toml name), not that directory's."""
    shutil.copytree(EXAMPLE / "billing_service" / "defs" / "outbox", project / "billing_service" / "defs" / "outbox")
    sink = HttpSink().start()
    try:
        env = adopter_env(tmp_path, db_url, f"{sink.url}invoices")
        run("outbox-pipelines db upgrade", project, env)
        run(
            "outbox-pipelines enqueue --table billing_outbox --topic invoice.issued --payload {} --event-id w-1",
            project,
            env,
        )
        workspace = tmp_path / "platform"
        workspace.mkdir()
        (workspace / "run.yaml").write_text(
            "ops:\n  relay_table:\n    config:\n      table: billing_outbox\n      once: true\n"
        )
        run(f"dagster job execute -m billing_service.definitions -d {project} -j relay_job -c run.yaml", workspace, env)
        assert sink.counts == {"w-1": 1}, sink.counts
    finally:
        sink.stop()
