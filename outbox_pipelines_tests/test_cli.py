"""The command line as a user runs it: help, exit codes, clear errors, nothing written on bad input."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import enqueue_n, rows, statuses
from outbox_pipelines_tests.processes import CLI, free_port, start_relay, stop_process
from outbox_pipelines_tests.rows import make_dead, make_sent, make_stuck
from outbox_pipelines_tests.scratch import DEMO_PARTS

COMMANDS = [
    ["db", "upgrade"],
    ["db", "create-table"],
    ["db", "url"],
    ["db", "stop"],
    ["enqueue"],
    ["status"],
    ["relay"],
    ["replay"],
    ["requeue-stuck"],
    ["clean"],
    ["demo"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_has_help(command, cli_env):
    result = run_cli(cli_env, *command, "--help")
    assert result.returncode == 0
    assert "usage: outbox-pipelines" in result.stdout
    assert len(result.stdout.splitlines()) > 3


def test_top_level_help_lists_commands_and_exit_codes(cli_env):
    result = run_cli(cli_env, "--help")
    for name in ("db", "enqueue", "status", "relay", "replay", "requeue-stuck", "clean", "demo"):
        assert name in result.stdout
    assert "Exit codes" in result.stdout


def test_enqueue_status_relay_round_trip(cli_env, conn):
    result = run_cli(
        cli_env,
        "enqueue",
        "--table",
        "outbox_events",
        "--topic",
        "org.changed",
        "--payload",
        '{"org_id": 7}',
        "--event-id",
        "cli-1",
        "--trace-id",
        "tr-9",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["duplicate"] is False
    again = run_cli(
        cli_env,
        "enqueue",
        "--table",
        "outbox_events",
        "--topic",
        "org.changed",
        "--payload",
        '{"org_id": 7}',
        "--event-id",
        "cli-1",
    )
    assert again.returncode == 0 and "duplicate" in again.stdout
    status = run_cli(cli_env, "status", "--table", "outbox_events", "--json")
    assert json.loads(status.stdout)[0]["counts"]["pending"] == 1
    relay = run_cli(cli_env, "relay", "--table", "outbox_events", "--once")
    assert relay.returncode == 0, relay.stderr
    assert "sent 1" in relay.stdout
    row = rows(conn, "outbox_events")[0]
    assert (row["status"], row["result_ref"], row["headers"]) == ("sent", "org:7", {"trace_id": "tr-9"})


@pytest.mark.parametrize(
    "payload, message",
    [("{not json", "not valid JSON"), ("[1,2]", "must be a JSON object"), ('{"a": "\\u0000"}', "\\u0000")],
)
def test_enqueue_bad_payload_exits_2_and_writes_nothing(cli_env, conn, payload, message):
    result = run_cli(cli_env, "enqueue", "--table", "outbox_events", "--topic", "org.changed", "--payload", payload)
    assert result.returncode == 2
    assert message in result.stderr
    assert statuses(conn, "outbox_events") == {}


def test_enqueue_unknown_topic_on_a_handler_table_is_refused(cli_env, conn):
    result = run_cli(cli_env, "enqueue", "--table", "outbox_events", "--topic", "nobody.listens", "--payload", "{}")
    assert result.returncode == 2
    assert "no handler for topic 'nobody.listens'" in result.stderr and "org.changed" in result.stderr
    assert statuses(conn, "outbox_events") == {}
    forced = run_cli(
        cli_env,
        "enqueue",
        "--table",
        "outbox_events",
        "--topic",
        "nobody.listens",
        "--payload",
        "{}",
        "--allow-unknown-topic",
    )
    assert forced.returncode == 0


def test_invalid_table_name_is_a_usage_error(cli_env):
    result = run_cli(cli_env, "status", "--table", "Robert'); DROP TABLE x;--")
    assert result.returncode == 2
    assert "invalid outbox table name" in result.stderr


def test_unconfigured_table_says_where_to_configure_it(cli_env):
    result = run_cli(cli_env, "relay", "--table", "hrm_outbox", "--once")
    assert result.returncode == 2
    assert "[tables.hrm_outbox]" in result.stderr


def test_unreachable_database_exits_1_with_what_to_check(cli_env):
    env = {**cli_env, "OUTBOX_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/x?connect_timeout=2"}
    result = run_cli(env, "status")
    assert result.returncode == 1
    assert "cannot connect to PostgreSQL" in result.stderr and "OUTBOX_DATABASE_URL" in result.stderr
    assert "secret" not in result.stderr


def test_bad_environment_value_is_a_usage_error(cli_env):
    result = run_cli({**cli_env, "OUTBOX_BATCH_SIZE": "lots"}, "status")
    assert result.returncode == 2
    assert "OUTBOX_BATCH_SIZE='lots' is not a whole number" in result.stderr


def test_replay_needs_a_filter_and_reports_dry_run(cli_env, conn):
    ids = enqueue_n(conn, "outbox_events", 2)
    make_dead(conn, "outbox_events", code="BAD_REQUEST")
    assert run_cli(cli_env, "replay", "--table", "outbox_events").returncode == 2
    dry = run_cli(cli_env, "replay", "--table", "outbox_events", "--all", "--dry-run")
    assert dry.returncode == 0 and "2 dead rows matched" in dry.stdout and "--force" in dry.stdout
    forced = run_cli(cli_env, "replay", "--table", "outbox_events", "--id", str(ids[0]), "--force", "--json")
    assert json.loads(forced.stdout)["replayed_ids"] == [ids[0]]
    assert statuses(conn, "outbox_events") == {"pending": 1, "dead": 1}


def test_requeue_and_clean_commands(cli_env, conn):
    enqueue_n(conn, "outbox_events", 2)
    make_stuck(conn, "outbox_events", lease_left=timedelta(seconds=-1))
    result = run_cli(cli_env, "requeue-stuck", "--table", "outbox_events")
    assert result.returncode == 0 and "requeued 2" in result.stdout
    make_sent(conn, "outbox_events", age=timedelta(days=8))
    result = run_cli(cli_env, "clean", "--table", "outbox_events")
    assert result.returncode == 0 and "deleted 2 sent rows" in result.stdout
    assert statuses(conn, "outbox_events") == {}


def test_clean_cleans_the_shared_tables_once_even_when_the_first_tables_cleaner_is_off(cli_env, conn, tmp_path):
    config = tmp_path / "outbox.toml"
    config.write_text(
        DEMO_PARTS + "[tables.outbox_events]\ncleaner_enabled = false\n"
    )  # the first table, sorted by name
    conn.execute(
        "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) VALUES "
        "('old', 'sha256:a', now() - interval '1 minute')"
    )
    conn.execute(
        "INSERT INTO outbox_audit (outbox_table, code, worker, created_at) "
        "VALUES ('outbox_events', 'outbox_claim', 'w', now() - interval '40 days')"
    )
    result = run_cli({**cli_env, "OUTBOX_CONFIG": str(config)}, "clean", "--audit-retention", "30d")
    assert result.returncode == 0, result.stderr
    assert "outbox_events: cleaner disabled" in result.stdout
    assert result.stdout.count("idempo_ledger: deleted 1 expired rows; outbox_audit: deleted 1 old rows") == 1
    assert conn.execute("SELECT count(*) AS n FROM idempo_ledger").fetchone()["n"] == 0


def test_clean_with_the_cleaner_switched_off_everywhere_deletes_nothing_not_even_the_ledger(cli_env, conn):
    conn.execute(
        "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) VALUES "
        "('old', 'sha256:a', now() - interval '1 minute')"
    )
    result = run_cli({**cli_env, "OUTBOX_CLEANER_ENABLED": "false"}, "clean")
    assert result.returncode == 0, result.stderr
    assert "idempo_ledger, outbox_audit: not cleaned (the cleaner is disabled for every table chosen)" in result.stdout
    assert conn.execute("SELECT count(*) AS n FROM idempo_ledger").fetchone()["n"] == 1


def test_create_table_then_relay_it_with_a_config_file(cli_env, conn, tmp_path):
    config = tmp_path / "outbox.toml"
    config.write_text('[tables.hrm_outbox]\ndestination = "paper"\npreset = "generic"\nmax_attempts = 5\n')
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    created = run_cli(env, "db", "create-table", "hrm_outbox")
    assert created.returncode == 0 and "created outbox table hrm_outbox" in created.stdout
    assert run_cli(env, "enqueue", "--table", "hrm_outbox", "--topic", "x", "--payload", "{}").returncode == 0
    relay = run_cli(env, "relay", "--table", "hrm_outbox", "--once")
    assert relay.returncode == 0 and "sent 1" in relay.stdout


def test_create_table_takes_many_names_and_checks_them_all_first(cli_env, conn):
    """A project's module tables in one command; one bad name creates none of them."""
    refused = run_cli(cli_env, "db", "create-table", "a_outbox", "B_outbox")
    assert refused.returncode == 2 and "invalid outbox table name 'B_outbox'" in refused.stderr
    exists = "SELECT count(*) AS n FROM pg_tables WHERE tablename = ANY(%s)"
    assert conn.execute(exists, (["a_outbox"],)).fetchone()["n"] == 0
    created = run_cli(cli_env, "db", "create-table", "a_outbox", "b_outbox", "a_outbox")
    assert created.returncode == 0, created.stderr
    assert created.stdout.count("created outbox table") == 2 and "created outbox table b_outbox" in created.stdout
    assert conn.execute(exists, (["a_outbox", "b_outbox"],)).fetchone()["n"] == 2


def test_a_group_relay_names_the_tables_it_leaves_out_and_exits_2(cli_env, conn, tmp_path):
    """A section with a mistake leaves its table out of every relay group: the group relay says so when it starts
    (a long-running relay's log shows it) and exits 2, after relaying the tables it can."""
    config = tmp_path / "outbox.toml"
    config.write_text(
        'shipped_tables = false\n[tables.hrm_outbox]\ndestination = "paper"\n'
        '[tables.billing_outbox]\ndestination = "http"\n'  # no url
        '[tables.payroll_outbox]\ndestination = "http"\ngroup = "payroll"\n'  # no url, another group's
    )
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    for table in ("hrm_outbox", "billing_outbox"):
        created = run_cli(env, "db", "create-table", table)
        assert created.returncode == 0, created.stderr
    # The broken table is declared: create-table says what is wrong with its section, not "add a section".
    assert "billing_outbox cannot be relayed until its section is fixed" in created.stderr
    assert "has no url" in created.stderr and "add a [tables.billing_outbox]" not in created.stdout
    for table in ("hrm_outbox", "billing_outbox"):
        enqueue_n(conn, table, 2, topic="x")

    relay = run_cli(env, "relay", "--group", "default", "--once")
    assert relay.returncode == 2, relay.stdout + relay.stderr
    said = relay.stderr.splitlines()
    left_out = next(i for i, line in enumerate(said) if line.startswith("error: billing_outbox was left out:"))
    assert left_out < next(i for i, line in enumerate(said) if line.startswith("relaying group default"))
    assert statuses(conn, "hrm_outbox") == {"sent": 2} and statuses(conn, "billing_outbox") == {"pending": 2}

    assert "payroll_outbox" not in relay.stderr  # another group's table: its own group's relay tells it

    as_json = run_cli(env, "relay", "--group", "default", "--once", "--json")
    assert as_json.returncode == 2
    assert list(json.loads(as_json.stdout)["left_out"]) == ["billing_outbox"]
    payroll = run_cli(env, "relay", "--group", "payroll", "--once")
    assert payroll.returncode == 2 and "error: payroll_outbox was left out:" in payroll.stderr
    assert "billing_outbox" not in payroll.stderr


def test_db_upgrade_reports_up_to_date(cli_env):
    result = run_cli(cli_env, "db", "upgrade")
    assert result.returncode == 0 and "up to date" in result.stdout


def test_relay_serves_prometheus_metrics_while_it_runs(cli_env, conn):
    import time

    import httpx

    enqueue_n(conn, "outbox_events", 3, topic="org.changed", payload=lambda i: {"org_id": i})
    port = free_port()
    proc = start_relay(cli_env, "outbox_events", "--max-seconds", "20", "--metrics-port", str(port))
    try:
        sent = 'outbox_dispatch_total{result="success",table="outbox_events",tenant="",topic="org.changed"} 3.0'
        deadline, text = time.monotonic() + 20, ""
        while time.monotonic() < deadline and sent not in text:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert sent in text
        assert 'outbox_pending_count{table="outbox_events"} 0.0' in text
    finally:
        code = stop_process(proc, grace_s=20)
    assert code == 0


def test_a_handler_module_next_to_outbox_toml_imports_under_the_console_script(cli_env, conn, tmp_path):
    (tmp_path / "team_handlers.py").write_text(
        "from outbox_pipelines.core.destinations.handlers import HandlerRegistry\n"
        "registry = HandlerRegistry()\n"
        "registry.on('team.joined')(lambda message: 'team:' + str(message.payload['team']))\n"
    )
    (tmp_path / "outbox.toml").write_text(DEMO_PARTS + '[tables.outbox_events]\nhandlers = "team_handlers:registry"\n')
    console_script = [str(Path(sys.executable).with_name("outbox-pipelines"))]
    env = {**cli_env, "PYTHONPATH": ""}  # the console script as installed, nothing on the path but the package
    for args in (
        ["enqueue", "--table", "outbox_events", "--topic", "team.joined", "--payload", '{"team": 4}'],
        ["relay", "--table", "outbox_events", "--once", "--quiet"],
    ):
        result = subprocess.run(
            console_script + args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
    assert [(r["status"], r["result_ref"]) for r in rows(conn, "outbox_events")] == [("sent", "team:4")]


def test_a_relay_of_in_process_handlers_loads_no_http_or_dagster_stack(cli_env):
    """Each relay process starts in a fraction of a second: scaling out is starting more of them."""
    probe = (
        "import sys; from outbox_pipelines.cli import main; "
        "code = main(['relay', '--table', 'outbox_events', '--once', '--quiet']); "
        "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'httpx', 'dagster'}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=cli_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0 []"


def test_status_into_a_reader_that_stopped_ends_quietly_with_141(cli_env, conn):
    """`status | head -1`: the reader is gone before status writes. No traceback; the shell's code for it."""
    enqueue_n(conn, "outbox_events", 3)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader stopped before the command wrote anything
    try:
        done = subprocess.run(
            [*CLI, "status"], env=cli_env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_a_declared_business_table_s_name_is_told_and_the_outbox_tables_still_shown(cli_env, conn, tmp_path):
    """A team declares [tables.orders] where `orders` is its business table: db upgrade refuses it, and status,
    db status and relay say what it is instead of a database error (or drift fixes aimed at the business table)."""
    conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, total int)")
    config = tmp_path / "outbox.toml"
    config.write_text(
        DEMO_PARTS + '[tables.outbox_events]\ndestination = "paper"\n[tables.orders]\ndestination = "paper"\n'
    )
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    enqueue_n(conn, "outbox_events", 2)

    status = run_cli(env, "status")
    assert status.returncode == 1, status.stderr
    assert "outbox_events" in status.stdout and "the database refused" not in status.stderr
    assert "error: table 'orders' is not an outbox table" in status.stderr, status.stderr
    drift = run_cli(env, "db", "status")
    assert "orders is declared as an outbox table, but the table of that name is not one" in drift.stdout
    assert 'ON "orders"' not in drift.stdout, "no index to build on the business table"
    relay = run_cli(env, "relay", "--table", "orders", "--once")
    assert relay.returncode == 2 and "'orders' is not an outbox table" in relay.stderr, relay.stderr
    assert conn.execute("SELECT count(*) AS n FROM orders").fetchone()["n"] == 0
