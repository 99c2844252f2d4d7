import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from outbox_pipelines.core import wings
from outbox_pipelines.core.settings import TableSettings, load_settings
from outbox_pipelines_tests.processes import CLI
from outbox_pipelines_tests.scratch import REPOSITORY_PARTS, ScratchServer, TemplateDatabases
from outbox_pipelines_tests.sink import HttpSink

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "outbox_pipelines_tests"
# A server of your own for the tests (the session creates and drops its databases there);
# unset, the session starts an embedded one and stops it at the end.
TEST_URL_ENV = "OUTBOX_TEST_DATABASE_URL"


# The tests run as this repository's project, which declares the order product and the examples (outbox.toml):
# their destinations, roles and shared tables are known in this process as in its CLI's.
wings.declare(*REPOSITORY_PARTS)

# SIGTERM's and SIGINT's dispositions when this test process started, before any test or fixture ran.
_STARTING_DISPOSITIONS = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


@pytest.fixture(autouse=True)
def _signal_dispositions_as_at_start() -> Iterator[None]:
    """Every test starts with SIGTERM and SIGINT handled as when the test process started.

    Dagster run in-process maps SIGTERM to SIGINT's handler and leaves it so
    (``dagster._utils.interrupts.setup_interrupt_handlers``). Where the tests were started as a background
    job of a shell, SIGINT is ignored, so SIGTERM became ignored too, in this process and in every process
    a later test started: a relay sent SIGTERM during its start-up ignored it
    (test_stop_signals.py, "starting up"), as a supervisor's relay would not.
    """
    if threading.current_thread() is threading.main_thread():
        for sig, handler in _STARTING_DISPOSITIONS.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
    yield


# -- the unit lane (`pytest -m unit`) ------------------------------------------------------------------------
# A test is in it when none of its fixtures, directly or through others, starts a database, a server or a
# process, and no marker puts it among the slow ones: the marker is given here, never by hand.
NOT_UNIT_FIXTURES = frozenset(
    {
        "pg_server",  # the embedded PostgreSQL, and through it db_url, conn, cli_env, empty_db, module_db ...
        "http_sink",
        "silent_server",
        "raw_server",
        "receiver",
        "serve",
        "tls_server",
        "password_server",
        "echoing_gateway",
        "collector",
        "broker_sim",
        "nats_server",
        "cluster",
        "node",
        "installed",
        "soak_stack",
        "browser",
    }
)
NOT_UNIT_MARKERS = ("slow", "drill", "soak", "browser")
# Tests that start a server, a PostgreSQL or a process in their body, which none of their fixtures says: a file
# (every test in it) or one test (every case of it), out of the lane too.
STARTS_ITS_OWN = (
    "api/test_stalled_database.py",  # the Order API served, against ports that refuse or never answer
    "core/storage/test_embedded_dirs.py",  # embedded servers in trees of its own
    "test_dev_exposure.py",  # `outbox-pipelines dev`
    "api/test_order_path.py::test_broker_sim_command_serves_with_fault_injection",
    "core/relay/test_relay_process.py::test_a_process_freezes_its_startup_objects_once",
    "core/settings/test_settings_registry.py::test_the_module_prints_the_reference_tables",
    "core/test_enqueue.py::test_the_enqueue_api_imports_no_http_client",
    "core/test_url_means_what_it_shows.py::test_an_alert_webhook_url_that_reads_two_ways_posts_nothing",
    "defs/test_jobs.py::test_definitions_load_and_validate",  # `dagster definitions validate`
    "test_architecture.py::test_import_linter_contracts_hold",  # lint-imports
    "test_docs.py::test_the_docs_site_builds_with_no_broken_link",  # mkdocs build
    "test_extras.py::test_database_url_without_the_embedded_server_names_the_extra_and_the_variable",
    "test_project_boundaries.py::test_a_missing_database_url_is_an_error_not_a_throwaway_database",
    "test_prometheus_rules.py::test_promtool_checks_the_rules_and_every_alert_passes_its_tests",  # promtool
    "test_project_root.py::test_commands_in_sub_directories_share_the_projects_server",
    "test_public_api.py::test_importing_the_package_loads_no_dagster_no_http_client_and_no_wing",
)
# The fixtures that hand a test a database: asked for by a test of the unit lane (getfixturevalue), they fail it.
DATABASE_FIXTURES = frozenset({"pg_server", "db_url", "module_db", "empty_db", "conn"})
_unit_test_running: str | None = None


def _starts_its_own(item: pytest.Item) -> str | None:
    """The entry of STARTS_ITS_OWN naming ``item``, if one does."""
    if not item.path.is_relative_to(TESTS):
        return None
    path = item.path.relative_to(TESTS).as_posix()
    test = f"{path}::{item.name.partition('[')[0]}"
    return next((entry for entry in STARTS_ITS_OWN if entry in (path, test)), None)


@pytest.hookimpl(tryfirst=True)  # before -m selects on it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    named = set()
    for item in items:
        entry = _starts_its_own(item)
        named.add(entry)
        fixtures = set(getattr(item, "fixturenames", ()))
        if entry is None and fixtures.isdisjoint(NOT_UNIT_FIXTURES):
            if not any(map(item.get_closest_marker, NOT_UNIT_MARKERS)):
                item.add_marker(pytest.mark.unit)
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    if whole and not config.getoption("ignore") and not config.getoption("ignore_glob"):
        if stale := set(STARTS_ITS_OWN) - named:
            raise pytest.UsageError(f"STARTS_ITS_OWN (conftest.py) names tests that are no more: {sorted(stale)}")


_refused: list[tuple[pytest.FixtureDef[object], pytest.FixtureRequest]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    global _unit_test_running
    _unit_test_running = item.nodeid if item.get_closest_marker("unit") else None
    yield
    _unit_test_running = None
    while _refused:  # the refusal was this test's: the next test that may have the database gets it
        fixturedef, request = _refused.pop()
        fixturedef.finish(request)  # type: ignore[arg-type]  # the SubRequest pytest_fixture_setup was given


class _DatabaseRefusedToUnitTests:
    """A plugin, not a conftest hook: pytest asks a conftest only about fixtures below its directory, and a
    session's fixtures are the session's, at the repository's root."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> None:
        """A test of the unit lane that asks for a database (request.getfixturevalue) fails before one starts."""
        if _unit_test_running is None or fixturedef.argname not in DATABASE_FIXTURES:
            return
        try:
            pytest.fail(
                f"{_unit_test_running} is in the unit lane (-m unit), which starts no database, and asked for "
                f"{fixturedef.argname!r}: name it as an argument of the test, which takes it out of the lane",
                pytrace=False,
            )
        except pytest.fail.Exception as refusal:
            # Kept as pytest keeps a fixture's own failure (FixtureDef.execute expects it), forgotten after the test.
            key = fixturedef.cache_key(request)  # type: ignore[arg-type]  # the SubRequest pytest passes
            fixturedef.cached_result = (None, key, (refusal, refusal.__traceback__))
            _refused.append((fixturedef, request))
            raise


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_DatabaseRefusedToUnitTests(), "outbox-unit-lane")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TemplateDatabases]:
    """One server per session, a template database with the migrations applied (pgqueuer's approach).

    Started by the first test that needs a database, never by the unit lane (``-m unit``)."""
    server = ScratchServer.from_env(TEST_URL_ENV, dir_prefix="outbox-test-pg-")
    try:
        databases = TemplateDatabases(server.admin_url, prefix=f"outbox_t{os.getpid()}")
        yield databases
        databases.drop_template()
    finally:
        server.stop()


@pytest.fixture
def db_url(pg_server: TemplateDatabases) -> Iterator[str]:
    """A fresh, migrated database for this test only."""
    name, url = pg_server.create_database()
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[DictRow]]:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as connection:
        yield connection


@pytest.fixture
def cli_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running the CLI or relay processes against the test database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["OUTBOX_DATABASE_URL"] = db_url
    env["PYTHONPATH"] = str(REPO)
    return env


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def table_settings(table_name: str, **overrides: object) -> TableSettings:
    """The shipped settings of ``table_name`` (built-in defaults), with test overrides."""
    settings = load_settings(env={}, path=None)
    base = settings.tables.get(table_name) or TableSettings(name=table_name)
    return replace(base, **overrides)  # type: ignore[arg-type]  # overrides are TableSettings fields by name


@pytest.fixture
def http_sink() -> Iterator[HttpSink]:
    sink = HttpSink().start()
    yield sink
    sink.stop()
