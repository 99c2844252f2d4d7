import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core.settings import TableSettings, load_settings
from outbox_pipelines_tests.pg import TestServer
from outbox_pipelines_tests.sink import HttpSink

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TestServer]:
    server = TestServer()
    yield server
    server.close()


@pytest.fixture
def db_url(pg_server: TestServer) -> Iterator[str]:
    """A fresh, migrated database for this test only."""
    name, url = pg_server.create_database()
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as connection:
        yield connection


@pytest.fixture
def cli_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running the CLI or relay processes against the test database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["OUTBOX_DATABASE_URL"] = db_url
    env["PYTHONPATH"] = str(REPO)
    return env


def run_cli(env: dict[str, str], *args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "outbox_pipelines.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def table_settings(name: str, **overrides: object) -> TableSettings:
    """The shipped settings of ``name`` (built-in defaults), with test overrides."""
    from dataclasses import replace

    settings = load_settings(env={}, path=None)
    base = settings.tables.get(name) or TableSettings(name=name)
    return replace(base, **overrides)


@pytest.fixture
def http_sink() -> Iterator[HttpSink]:
    sink = HttpSink().start()
    yield sink
    sink.stop()
