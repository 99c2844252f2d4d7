"""Forward-only, checksummed migrations from sql/migrations, safe to run concurrently.

Its own statements are bootstrap.sql's, run through queries.py rather than core/storage/table.py:
they run before the schema that table.py's statements need exists.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.queries import shared_query, sql_dir

# Any constant shared by every process that migrates this database.
MIGRATION_LOCK_KEY = 0x0B0C5_0001


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover(directory: Path | None = None) -> list[Migration]:
    directory = directory or sql_dir() / "migrations"
    found = []
    for path in sorted(directory.glob("*.sql")):
        version, _, rest = path.stem.partition("_")
        if not version.isdigit():
            raise MigrationError(f"migration file {path.name} must start with a number, like 0003_add_x.sql")
        found.append(Migration(version, path.name, path, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number in {directory}")
    return found


def _run(conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One bootstrap.sql statement; its rows as dicts (none for a statement that returns nothing)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(name), params)
        return cur.fetchall() if cur.description else []


def _check_unchanged(migration: Migration, recorded_checksum: str) -> None:
    if recorded_checksum != migration.checksum:
        raise MigrationError(
            f"migration {migration.name} was edited after it was applied to this database "
            f"(checksum {recorded_checksum[:12]} recorded, {migration.checksum[:12]} on disk). "
            "Migrations are forward-only: restore the file and put the change in a new migration."
        )


def _apply(conn: psycopg.Connection, migration: Migration) -> None:
    """Run the migration and record it in one transaction: all of it, or nothing."""
    try:
        with conn.transaction():
            conn.execute(migration.sql)
            _run(
                conn,
                "outbox_schema_migrations_record",
                {"version": migration.version, "name": migration.name, "checksum": migration.checksum},
            )
    except psycopg.Error as exc:
        raise MigrationError(f"migration {migration.name} failed and was rolled back: {exc}") from exc


def upgrade(url: str, directory: Path | None = None) -> list[str]:
    """Apply every migration not yet applied; return the names applied now."""
    migrations = discover(directory)
    applied_now: list[str] = []
    with connect(url) as conn:
        # A session lock serialises concurrent upgrades; the loser sees the winner's rows.
        _run(conn, "outbox_schema_migrations_lock", {"key": MIGRATION_LOCK_KEY})
        try:
            # Created only when missing: CREATE TABLE IF NOT EXISTS needs CREATE on the schema even when the
            # table exists, which the Order API's role (db grant) does not hold.
            if not _run(conn, "outbox_schema_migrations_exists")[0]["ok"]:
                _run(conn, "outbox_schema_migrations_create")
            checksums = {row["version"]: row["checksum"] for row in _run(conn, "outbox_schema_migrations_applied")}
            for migration in migrations:
                if migration.version in checksums:
                    _check_unchanged(migration, checksums[migration.version])
                    continue
                _apply(conn, migration)
                applied_now.append(migration.name)
        finally:
            _run(conn, "outbox_schema_migrations_unlock", {"key": MIGRATION_LOCK_KEY})
    return applied_now


def pending(url: str, directory: Path | None = None) -> list[str]:
    with connect(url) as conn:
        applied = set()
        if _run(conn, "outbox_schema_migrations_exists")[0]["ok"]:
            applied = {row["version"] for row in _run(conn, "outbox_schema_migrations_applied")}
    return [m.name for m in discover(directory) if m.version not in applied]
