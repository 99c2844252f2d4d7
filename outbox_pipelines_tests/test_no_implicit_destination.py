"""Issue 22: where messages go is never implicit, and messages that go nowhere are said to.

Before: a table declared ``destination = "http"`` without ``url`` was relayed to the paper broker and every
message marked sent (audit ``ref=paper-…``), while ``status`` and ``dg check defs`` accepted the table.
Now it is refused where settings load (the CLI exits 2, the code location fails to load, naming the table
and the key); the paper broker is chosen only explicitly or as the orders table's default while
OUTBOX_BROKER_URL is unset, and then relay starts, ``status`` and the destination check say so.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.conftest import REPO, run_cli
from outbox_pipelines_tests.helpers import enqueue_n, rows
from outbox_pipelines_tests.scratch import DEMO_PARTS

BIN = Path(sys.executable).parent
NO_URL = '[tables.billing_outbox]\ndestination = "http"\nmode = "competing"\n'
SAID = '[tables.billing_outbox] destination = "http" has no url'


def adopter(tmp_path: Path, config: str) -> Path:
    """A project of the team's own: its pyproject.toml and outbox.toml, nothing of this repository's."""
    project = tmp_path / "billing_service"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "billing_service"\nversion = "0.1.0"\n')
    (project / "outbox.toml").write_text(config)
    return project


def test_an_http_table_without_a_url_is_refused_by_every_command(cli_env, tmp_path, conn):
    project = adopter(tmp_path, NO_URL)
    conn.execute("SELECT 1")  # the database exists and is migrated: only the settings can refuse
    for command in (
        ["status"],
        ["relay", "--table", "billing_outbox", "--once"],
        ["enqueue", "--table", "billing_outbox", "--topic", "invoice.paid", "--payload", "{}"],
    ):
        result = run_cli(cli_env, *command, cwd=project)
        assert result.returncode == 2, f"{command}: {result.returncode}\n{result.stdout}{result.stderr}"
        assert SAID in result.stderr and "set url =" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_code_location_fails_to_load_naming_the_table_and_key(cli_env, tmp_path):
    project = adopter(tmp_path, NO_URL)
    env = {**cli_env, "OUTBOX_CONFIG": str(project / "outbox.toml")}
    for command in ([str(BIN / "dagster"), "definitions", "validate"], [str(BIN / "dg"), "check", "defs"]):
        result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"{command} accepted an http table without a url:\n{output}"
        assert SAID in output, output


def test_a_table_without_a_destination_is_refused(cli_env, tmp_path):
    project = adopter(tmp_path, '[tables.billing_outbox]\nmode = "competing"\n')
    result = run_cli(cli_env, "status", cwd=project)
    assert result.returncode == 2 and "[tables.billing_outbox] names no destination" in result.stderr, result.stderr


def test_the_paper_order_broker_is_said_at_relay_start_in_status_and_by_the_check(cli_env, conn, tmp_path):
    """Seed 001's default (no OUTBOX_BROKER_URL) keeps working, and nobody can miss that it delivers nothing."""
    (tmp_path / "outbox.toml").write_text(DEMO_PARTS)  # a project that uses the order product
    enqueue_n(conn, "outbox_orders", 2)
    relay = run_cli(cli_env, "relay", "--table", "outbox_orders", "--once", cwd=tmp_path)
    assert relay.returncode == 0, relay.stderr
    assert "warning: outbox_orders: OUTBOX_BROKER_URL is unset: the paper broker" in relay.stderr
    assert {r["status"] for r in rows(conn, "outbox_orders")} == {"sent"}

    status = run_cli(cli_env, "status", "--table", "outbox_orders", cwd=tmp_path)
    assert "outbox_orders: OUTBOX_BROKER_URL is unset" in status.stdout, status.stdout
    # status reads the variable in its own shell, not in the relays' processes: it says so.
    assert "(read from this shell's environment: relays started elsewhere" in status.stdout, status.stdout
    as_json = json.loads(run_cli(cli_env, "status", "--json", cwd=tmp_path).stdout)
    nowhere = {entry["table"]: entry["delivers_nowhere"] for entry in as_json}
    assert nowhere["outbox_orders"] and nowhere["outbox_events"] is None

    table = load_settings(env={}, path=tmp_path / "outbox.toml").table("outbox_orders")
    verdicts = evaluate_checks(
        read_status(OutboxTable(conn, "outbox_orders")), table.checks, delivers_nowhere=table.delivers_nowhere
    )
    destination = {v.name: v for v in verdicts}["destination"]
    assert "delivers nothing" in destination.description and destination.metadata["delivers_nowhere"] is True
