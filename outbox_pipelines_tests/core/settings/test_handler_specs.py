"""A handler spec names a HandlerRegistry or a function marked ``@HandlerRegistry.factory`` (issue 42, point 3).

Before: ``handlers = "sys:exit"`` loaded, the relay called it (exit 0, nothing relayed), ``enqueue`` on the table
exited 0 having written nothing, ``os:abort`` killed the relay and ``dg check defs`` accepted them all. Now what a
spec names is checked when the settings load, never called: anything else is refused with the spec and why.
"""

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from outbox_pipelines.core.destinations.wiring import load_registry
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines_tests.conftest import REPO, run_cli
from outbox_pipelines_tests.helpers import statuses

BIN = Path(sys.executable).parent
TABLE = "team_outbox"

# The team's own module. Importing it runs its top-level code (the user's, as any import of their code does);
# calling any function of it would leave a file behind, so a test can tell that nothing was called.
MODULE = """
from pathlib import Path
from outbox_pipelines import HandlerRegistry

HERE = Path(__file__).parent
registry = HandlerRegistry()

@registry.on("invoice.paid")
def record(message):
    (HERE / "handled").write_text(message.event_id)

def plain():
    (HERE / "called-plain").write_text("called")
    return registry

@HandlerRegistry.factory
def factory():
    (HERE / "called-factory").write_text(str(int((HERE / "called-factory").exists()) + 1))
    return registry

@HandlerRegistry.factory
def wrong_factory():
    return "not a registry"

@HandlerRegistry.factory
def exiting_factory():
    raise SystemExit(0)

class Registryish:
    pass

text = "registry"
"""


@pytest.fixture
def team_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"team_handlers_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def section(spec: str) -> str:
    return f'[tables.{TABLE}]\ndestination = "handlers"\nhandlers = "{spec}"\n'


def load(tmp_path: Path, spec: str):
    path = tmp_path / "outbox.toml"
    path.write_text("shipped_tables = false\n" + section(spec))
    return load_settings(env={}, path=path)


@pytest.mark.parametrize(
    ("attribute", "reason"),
    [
        ("plain", "a function (plain) not marked @HandlerRegistry.factory"),
        ("Registryish", "a class (Registryish)"),
        ("text", "a str"),
        ("Path", "a class (Path)"),
    ],
)
def test_a_spec_naming_anything_but_a_registry_is_refused_at_load_and_nothing_is_called(
    tmp_path, team_module, attribute, reason
):
    spec = f"{team_module}:{attribute}"
    settings = load(tmp_path, spec)
    problem = settings.broken[TABLE]
    assert f"handlers = {spec!r}: it is {reason}, not a HandlerRegistry" in problem, problem
    assert "Nothing was called" in problem
    assert TABLE not in settings.tables
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("called")) == []


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("sys:exit", "a built-in function (exit)"),
        ("os:abort", "a built-in function (abort)"),
        ("os:_exit", "a built-in function (_exit)"),
        ("builtins:print", "a built-in function (print)"),
        ("os:path", "a module"),
    ],
)
def test_the_standard_librarys_callables_are_refused_by_name(tmp_path, spec, reason):
    problem = load(tmp_path, spec).broken[TABLE]
    assert f"handlers = {spec!r}: it is {reason}, not a HandlerRegistry" in problem, problem


def test_a_registry_and_a_marked_factory_are_accepted_and_the_factory_runs_at_build_only(tmp_path, team_module):
    assert TABLE in load(tmp_path, f"{team_module}:registry").tables
    settings = load(tmp_path, f"{team_module}:factory")
    assert TABLE in settings.tables
    assert not (tmp_path / "called-factory").exists()  # checked at load, not called
    registry = load_registry(f"{team_module}:factory")
    assert registry.topics == ("invoice.paid",)
    assert (tmp_path / "called-factory").read_text() == "1"


def test_a_factory_that_returns_something_else_or_exits_is_a_config_error(tmp_path, team_module):
    with pytest.raises(ConfigError, match="the factory returned a str, which is not a HandlerRegistry"):
        load_registry(f"{team_module}:wrong_factory")
    with pytest.raises(ConfigError, match="the factory raised SystemExit"):
        load_registry(f"{team_module}:exiting_factory")
    with pytest.raises(ConfigError, match="not marked @HandlerRegistry.factory"):
        load_registry(f"{team_module}:plain")
    assert not (tmp_path / "called-plain").exists()


def test_enqueue_status_and_relay_of_a_sys_exit_table_exit_2_and_write_nothing(cli_env, conn, tmp_path):
    (tmp_path / "outbox.toml").write_text(section("sys:exit"))
    said = "handlers = 'sys:exit': it is a built-in function (exit), not a HandlerRegistry"
    assert run_cli(cli_env, "db", "create-table", TABLE, cwd=tmp_path).returncode == 0
    for command in (
        ["enqueue", "--table", TABLE, "--topic", "invoice.paid", "--payload", "{}"],
        ["relay", "--table", TABLE, "--once"],
        ["status", "--table", TABLE],
    ):
        result = run_cli(cli_env, *command, cwd=tmp_path)
        assert result.returncode == 2, f"{command}: {result.returncode}\n{result.stdout}{result.stderr}"
        assert said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert statuses(conn, TABLE) == {}


def test_a_marked_factory_relays_end_to_end(cli_env, conn, tmp_path):
    (tmp_path / "team_factory_handlers.py").write_text(MODULE)
    (tmp_path / "outbox.toml").write_text(section("team_factory_handlers:factory"))
    assert run_cli(cli_env, "db", "create-table", TABLE, cwd=tmp_path).returncode == 0
    args = ("enqueue", "--table", TABLE, "--topic", "invoice.paid", "--payload", "{}", "--event-id", "inv-1")
    enqueued = run_cli(cli_env, *args, cwd=tmp_path)
    assert enqueued.returncode == 0, enqueued.stderr
    relayed = run_cli(cli_env, "relay", "--table", TABLE, "--once", "--quiet", cwd=tmp_path)
    assert relayed.returncode == 0, relayed.stderr
    assert statuses(conn, TABLE) == {"sent": 1}
    assert (tmp_path / "handled").read_text() == "inv-1"


@pytest.mark.slow
def test_dg_check_defs_refuses_a_spec_that_names_no_registry(cli_env, tmp_path):
    config = tmp_path / "outbox.toml"
    config.write_text(section("os:abort"))
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    result = subprocess.run(
        [str(BIN / "dg"), "check", "defs"], env=env, cwd=REPO, capture_output=True, text=True, timeout=180
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "handlers = 'os:abort': it is a built-in function (abort), not a HandlerRegistry" in output, output
