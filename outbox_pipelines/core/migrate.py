"""Forward-only, checksummed migrations from sql/migrations, safe to run concurrently.

Its own statements are bootstrap.sql's, run through queries.py rather than core/table.py:
they run before the schema that table.py's statements need exists.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

import psycopg

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.queries import shared_query, sql_dir

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


def upgrade(url: str, directory: Path | None = None) -> list[str]:
    """Apply every migration not yet applied; return the names applied now."""
    migrations = discover(directory)
    applied_now: list[str] = []
    with connect(url) as conn:
        # A session lock serialises concurrent upgrades; the loser sees the winner's rows.
        conn.execute(shared_query("outbox_schema_migrations_lock"), {"key": MIGRATION_LOCK_KEY})
        try:
            conn.execute(shared_query("outbox_schema_migrations_create"))
            rows = conn.execute(shared_query("outbox_schema_migrations_applied")).fetchall()
            applied = {row["version"]: row for row in rows}
            for migration in migrations:
                row = applied.get(migration.version)
                if row is not None:
                    if row["checksum"] != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.name} was edited after it was applied to this database "
                            f"(checksum {row['checksum'][:12]} recorded, {migration.checksum[:12]} on disk). "
                            "Migrations are forward-only: restore the file and put the change in a new migration."
                        )
                    continue
                try:
                    with conn.transaction():
                        conn.execute(migration.sql)
                        conn.execute(shared_query("outbox_schema_migrations_record"), {
                            "version": migration.version, "name": migration.name, "checksum": migration.checksum})
                except psycopg.Error as exc:
                    raise MigrationError(f"migration {migration.name} failed and was rolled back: {exc}") from exc
                applied_now.append(migration.name)
        finally:
            conn.execute(shared_query("outbox_schema_migrations_unlock"), {"key": MIGRATION_LOCK_KEY})
    return applied_now


def pending(url: str, directory: Path | None = None) -> list[str]:
    with connect(url) as conn:
        exists = conn.execute(shared_query("outbox_schema_migrations_exists")).fetchone()
        applied = set()
        if exists and exists["ok"]:
            applied = {r["version"] for r in conn.execute(shared_query("outbox_schema_migrations_applied"))}
    return [m.name for m in discover(directory) if m.version not in applied]
