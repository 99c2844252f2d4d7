"""What a ``relay`` command line imports: its own command's module and the relay, none of the other commands'
modules nor what only they need (bench/small_backlogs.py: a CLI relay's start is most of a small backlog's drain)."""

import json
import subprocess
import sys

from outbox_pipelines.cli import build_parser
from outbox_pipelines_tests.conftest import run_cli

# Modules a relay at its defaults never uses: the other commands', the enqueue side, the on-call and operations
# layers, the roles (db grant's help), a relay group, Prometheus's client (no --metrics-port: what the relay counts
# stays in telemetry/counts.py), OpenTelemetry's API (tracing off: no OTEL_* variable), and the stacks of Dagster
# and the HTTP and broker clients.
NOT_FOR_A_RELAY = (
    "outbox_pipelines.cli.db_commands",
    "outbox_pipelines.cli.enqueue_command",
    "outbox_pipelines.cli.init_command",
    "outbox_pipelines.cli.metrics_command",
    "outbox_pipelines.cli.oncall_commands",
    "outbox_pipelines.cli.operations_commands",
    "outbox_pipelines.cli.servers",
    "outbox_pipelines.core.enqueue",
    "outbox_pipelines.core.prepare",
    "outbox_pipelines.core.oncall",
    "outbox_pipelines.core.operations",
    "outbox_pipelines.core.storage.roles",
    "outbox_pipelines.core.relay.group",
    "outbox_pipelines.core.telemetry.metrics",
    "prometheus_client",
    "opentelemetry",
    "dagster",
    "aiohttp",
    "httpx",
    "nats",
    "aiormq",
    "confluent_kafka",
)


def loaded_beyond_a_relay(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == bad or m.startswith(bad + ".") for bad in NOT_FOR_A_RELAY)]


def test_parsing_a_relay_command_line_and_loading_its_command_imports_nothing_else():
    probe = (
        "import importlib, sys\n"
        "from outbox_pipelines.cli import build_parser\n"
        "argv = ['relay', '--table', 'outbox_events', '--once', '--quiet']\n"
        "handler = build_parser(argv).parse_args(argv).handler\n"
        "importlib.import_module(handler.module)\n"  # what the command imports when it runs
        "print(handler.module, ' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "outbox_pipelines.cli.relay_commands"
    assert "outbox_pipelines.core.relay" in out[1:]
    assert loaded_beyond_a_relay(out[1:]) == []


def test_the_parser_of_one_command_is_the_whole_tree_s_parser_of_that_command():
    whole = build_parser()
    commands = next(a for a in whole._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    assert {"relay", "db", "status", "enqueue"} <= set(commands)
    for name, parser in commands.items():
        alone = build_parser(["-v", "--config", "x.toml", name, "--help"])
        built = next(a for a in alone._actions if a.dest == "command").choices  # type: ignore[attr-defined]
        assert list(built) == [name]
        assert built[name].format_help() == parser.format_help()
    for other in (["--help"], ["--version"], ["relya"], [], ["--config"]):  # no command named: the whole tree
        again = next(a for a in build_parser(other)._actions if a.dest == "command").choices  # type: ignore[attr-defined]
        assert list(again) == list(commands)


def test_a_relay_run_from_the_command_line_imports_nothing_else(cli_env, tmp_path):
    """A project's table at its defaults (a project declaring parts loads their wings, which may need more)."""
    config = tmp_path / "outbox.toml"
    config.write_text('shipped_tables = false\n[tables.hrm_outbox]\ndestination = "paper"\n')
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    assert run_cli(env, "db", "create-table", "hrm_outbox").returncode == 0
    assert run_cli(env, "enqueue", "--table", "hrm_outbox", "--topic", "x", "--payload", "{}").returncode == 0
    probe = (
        "import json, sys\n"
        "from outbox_pipelines.cli import main\n"
        "code = main(['relay', '--table', 'hrm_outbox', '--once', '--json'])\n"
        "print(json.dumps([code, sorted(sys.modules)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report, (code, modules) = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert (code, report["sent"]) == (0, 1)
    assert loaded_beyond_a_relay(modules) == []
