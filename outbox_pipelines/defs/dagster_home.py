"""Dagster's own storage for `outbox-pipelines dev` and `demo`: a DAGSTER_HOME under .outbox/
with dagster.yaml, and a PostgreSQL database of its own on the outbox's server."""

import os
import stat
from pathlib import Path

import psycopg
from psycopg import sql

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage import db, network_limits
from outbox_pipelines.core.storage.queries import shared_query

DAGSTER_PG_URL_ENV = "OUTBOX_DAGSTER_PG_URL"


def dagster_yaml_source() -> Path:
    """The project's dagster.yaml (found from any sub-directory), else the one shipped with the package."""
    here = Path(__file__).resolve().parent.parent  # the package (defs/ is one below it)
    candidates = (
        Path.cwd() / "dagster.yaml",
        db.project_root() / "dagster.yaml",
        here.parent / "dagster.yaml",
        here / "_dagster.yaml",
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("cannot find dagster.yaml (expected next to workspace.yaml)")


def dagster_storage_url(outbox_url: str) -> str:
    """A psycopg2 URL (what dagster-postgres wants) to '<outbox db>_dagster' on the same server.

    Without the right to create databases, Dagster gets a 'dagster' schema in the outbox's database.
    """
    url = db.psycopg_url(outbox_url)
    info = psycopg.conninfo.conninfo_to_dict(url)
    database = f"{info.get('dbname') or 'postgres'}_dagster"[:63]
    with psycopg.connect(url, autocommit=True, **network_limits.params(url)) as conn:
        try:
            db.create_database_if_missing(conn, database)
        except psycopg.errors.InsufficientPrivilege:
            _dagster_schema(conn, database)
            joiner = "&" if "?" in url else "?"
            return "postgresql+psycopg2://" + url[len("postgresql://") :] + joiner + "options=-csearch_path%3Ddagster"
    return "postgresql+psycopg2://" + db.url_with_database(outbox_url, database)[len("postgresql://") :]


def _dagster_schema(conn: psycopg.Connection, database: str) -> None:
    """The schema "dagster" in the outbox's database, made unless this login may already write in it.

    ConfigError saying what to do when the login may create neither the database nor the schema (a relay's
    least-privilege login running `dev` on a team's database).
    """
    found = conn.execute(shared_query("dagster_schema_usable")).fetchone()
    assert found is not None  # an aggregate: one row
    usable, me, here = found
    if usable:
        return
    try:
        conn.execute(shared_query("dagster_schema_create"))
    except psycopg.errors.InsufficientPrivilege:
        login, outbox_db = (sql.Identifier(name).as_string(conn) for name in (me, here))
        raise ConfigError(
            f"Dagster's own storage: the login {login} may create neither a database {database!r} nor the schema "
            f"dagster in the database {outbox_db}. Set {DAGSTER_PG_URL_ENV} to a database Dagster may write in "
            f"(postgresql+psycopg2://…), or have the database's owner run, in {outbox_db}: "
            f"CREATE SCHEMA IF NOT EXISTS dagster; GRANT USAGE, CREATE ON SCHEMA dagster TO {login}"
        ) from None


def prepare_dagster_home(outbox_url: str) -> dict[str, str]:
    """Create DAGSTER_HOME with dagster.yaml; return the environment Dagster processes need.

    The default home is .outbox/dagster_home: .outbox/ and the home are 0700, dagster.yaml 0600 (directories
    it creates for a DAGSTER_HOME you name are 0700 too). What Dagster writes there itself (run and compute
    logs) is private when its processes run with umask 077, as `outbox-pipelines dev` starts them.
    """
    named = os.environ.get("DAGSTER_HOME")
    home = Path(named or db.private_embedded_dir() / "dagster_home").resolve()
    db.make_private_dirs(home)
    if not named and stat.S_IMODE(home.stat().st_mode) & 0o077:
        home.chmod(0o700)  # made by an earlier version with the umask's mode
    db.write_private_file(home / "dagster.yaml", dagster_yaml_source().read_bytes())
    return {
        "DAGSTER_HOME": str(home),
        DAGSTER_PG_URL_ENV: os.environ.get(DAGSTER_PG_URL_ENV) or dagster_storage_url(outbox_url),
        db.DATABASE_URL_ENV: outbox_url,
    }
