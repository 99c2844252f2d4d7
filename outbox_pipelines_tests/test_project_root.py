"""One embedded server per project: commands find the project's .outbox/ from any sub-directory."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage import db, project_dir
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import stop_project_server


@pytest.mark.parametrize("marker", ["pyproject.toml", "outbox.toml", ".outbox"])
def test_the_root_is_the_nearest_directory_holding_a_marker(tmp_path, marker):
    root = tmp_path / "project"
    deep = root / "docs" / "screenshots"
    deep.mkdir(parents=True)
    if marker == ".outbox":
        (root / marker).mkdir()
    else:
        (root / marker).write_text("")
    assert db.project_root(deep) == root.resolve()
    assert db.project_root(root) == root.resolve()


def test_a_nested_project_is_its_own_root(tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "outer" / "vendored"
    (inner / "src").mkdir(parents=True)
    (outer / "pyproject.toml").write_text("")
    (inner / "outbox.toml").write_text("")
    assert db.project_root(inner / "src") == inner.resolve()


def test_outside_any_project_the_directory_itself_is_the_root(tmp_path, monkeypatch):
    bare = tmp_path / "nowhere" / "special"
    bare.mkdir(parents=True)
    # A marker no directory above tmp_path holds: the walk goes up to / and finds nothing.
    monkeypatch.setattr(project_dir, "PROJECT_MARKERS", ("no-such-marker-3f9c",))
    assert db.project_root(bare) == bare.resolve()


def test_the_embedded_directory_follows_the_root_unless_named(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    monkeypatch.delenv(db.EMBEDDED_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path / "pkg" / "sub")
    assert db.embedded_dir() == (tmp_path / ".outbox").resolve()
    monkeypatch.setenv(db.EMBEDDED_DIR_ENV, str(tmp_path / "elsewhere"))
    assert db.embedded_dir() == (tmp_path / "elsewhere").resolve()


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project with two sub-directories; its embedded server is stopped at the end."""
    root = tmp_path / "proj"
    for sub in ("outbox_pipelines", "docs"):
        (root / sub).mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "someone_elses"\n')
    yield root
    stop_project_server(root / ".outbox")


def test_commands_in_sub_directories_share_the_projects_server(project):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}  # the embedded server, asked for
    (project / ".outbox").mkdir()
    upgrade = run_cli(env, "db", "upgrade", cwd=project / "outbox_pipelines", timeout=180)
    assert upgrade.returncode == 0, upgrade.stderr
    root_dir = (project / ".outbox").resolve()
    assert f"using the embedded PostgreSQL under {root_dir}: postgresql://" in upgrade.stderr
    # Tables made from one sub-directory are there from another: the same server, not a second one.
    status = run_cli(env, "status", "--json", cwd=project / "docs", timeout=120)
    assert status.returncode == 0, status.stderr
    assert f"under {root_dir}" in status.stderr
    assert not (project / "outbox_pipelines" / ".outbox").exists()
    assert not (project / "docs" / ".outbox").exists()


def test_the_projects_outbox_toml_is_read_from_any_sub_directory(project, db_url):
    (project / "outbox.toml").write_text('[tables.ledger_outbox]\ndestination = "paper"\n')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}, "OUTBOX_DATABASE_URL": db_url}
    assert run_cli(env, "db", "create-table", "ledger_outbox", cwd=project / "docs").returncode == 0
    status = run_cli(env, "status", "--table", "ledger_outbox", cwd=project / "docs")
    assert status.returncode == 0, status.stderr
    assert "ledger_outbox" in status.stdout


def test_a_command_outside_any_project_starts_no_server_there_and_says_how(tmp_path, monkeypatch):
    bare = tmp_path / "nowhere"
    bare.mkdir()
    monkeypatch.setattr(project_dir, "PROJECT_MARKERS", ("no-such-marker-3f9c",))  # nothing above tmp_path counts
    monkeypatch.chdir(bare)
    monkeypatch.delenv(db.DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(db.EMBEDDED_DIR_ENV, raising=False)
    with pytest.raises(ConfigError, match="OUTBOX_DATABASE_URL is unset: set it to your database"):
        db.resolve_database(announce=False)
    # `dev` may start one, but not in a directory nobody chose.
    with pytest.raises(ConfigError, match="no project here.*set OUTBOX_DATABASE_URL.*mkdir .outbox"):
        db.resolve_database(announce=False, may_start_embedded=True)
    assert list(bare.iterdir()) == []


def test_status_shows_the_tables_there_and_names_those_not_created_yet(project, db_url):
    (project / "outbox.toml").write_text(
        'shipped_tables = false\n\n[tables.ledger_outbox]\ndestination = "paper"\n\n'
        '[tables.a_much_longer_payroll_outbox]\ndestination = "paper"\n'
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}, "OUTBOX_DATABASE_URL": db_url}
    assert run_cli(env, "db", "create-table", "a_much_longer_payroll_outbox", cwd=project).returncode == 0
    status = run_cli(env, "status", cwd=project)
    assert status.returncode == 1
    header, row = status.stdout.splitlines()[:2]
    assert row.startswith("a_much_longer_payroll_outbox ") and header.index("pending") == row.index("0") - 6
    assert "not in the database yet: ledger_outbox. Run 'outbox-pipelines db upgrade'" in status.stderr
