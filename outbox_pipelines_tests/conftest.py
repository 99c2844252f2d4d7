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


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TemplateDatabases]:
    """One server per session, a template database with the migrations applied (pgqueuer's approach)."""
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
