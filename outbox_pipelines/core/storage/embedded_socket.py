"""Where the embedded server's Unix socket is: a directory only the server's owner can enter.

The server listens on a Unix socket only (no port clash) and trusts local connections, so reaching the socket must
be the privilege: the data directory itself, or a short private directory when the path is too long for a socket.
"""

import hashlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage.project_dir import embedded_dir

# The longest Unix socket path: sun_path less its NUL (Linux 108, macOS/BSD 104).
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107
SOCKET_NAME = ".s.PGSQL.5432"  # the embedded server listens on the default port's socket name
SOCKET_DIR_PREFIX = "obx-"


def _socket_fits(directory: Path) -> bool:
    return len(os.fsencode(str(directory / SOCKET_NAME))) <= SOCKET_PATH_MAX


def _is_private_dir(path: Path, owner_uid: int) -> bool:
    """A real directory (not a symlink) owned by ``owner_uid`` that nobody else may enter."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == owner_uid and st.st_mode & 0o077 == 0


def _make_private(path: Path, owner_uid: int, owner_gid: int) -> None:
    """Tighten a directory we (or the server user) own to mode 0700, owned by the server user."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (owner_uid, os.geteuid()):
        raise ConfigError(
            f"the embedded PostgreSQL's socket directory {path} is not a directory owned by its server user; "
            "stop the server ('outbox-pipelines db stop') and start again"
        )
    if st.st_uid != owner_uid:
        os.chown(path, owner_uid, owner_gid)
    os.chmod(path, 0o700)


def private_socket_dir(pgdata: Path, owner_uid: int, owner_gid: int) -> Path:
    """Where the embedded server puts its socket: a directory only ``owner_uid`` can enter.

    The data directory when the socket path fits (initdb makes it 0700); otherwise
    ``<tmp>/obx-<uid>-<hash of the data directory>``, created 0700 and checked to be
    ours and not a symlink (a name someone else took gets a fresh ``mkdtemp``
    directory instead). The server records the directory in postmaster.pid,
    which is how later commands find the socket.
    """
    if _socket_fits(pgdata) and _is_private_dir(pgdata, owner_uid):
        return pgdata
    stem = f"{SOCKET_DIR_PREFIX}{owner_uid}-{hashlib.sha256(os.fsencode(str(pgdata))).hexdigest()[:12]}"
    for base in dict.fromkeys([tempfile.gettempdir(), "/tmp"]):
        candidate = Path(base) / stem
        if not Path(base).is_dir() or not _socket_fits(candidate):
            continue
        try:
            os.mkdir(candidate, 0o700)
            os.chown(candidate, owner_uid, owner_gid)
            os.chmod(candidate, 0o700)
        except FileExistsError:
            pass
        if _is_private_dir(candidate, owner_uid):
            return candidate
        fresh = Path(tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{owner_uid}-", dir=base))  # 0700, ours
        os.chown(fresh, owner_uid, owner_gid)
        if _socket_fits(fresh):
            return fresh
        fresh.rmdir()
    raise ConfigError(
        f"no directory short enough for the embedded PostgreSQL's socket (the data directory {pgdata} is too "
        "long and so is the temporary directory); set OUTBOX_EMBEDDED_DIR to a shorter path"
    )


def embedded_socket_dir(data_root: Path | None = None) -> Path | None:
    """The socket directory of the embedded server under ``data_root`` (from postmaster.pid), if it runs."""
    pidfile = (data_root or embedded_dir()) / "pgdata" / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        return None
    return Path(lines[4]) if len(lines) > 4 and lines[4].strip() else None
