"""Forward-only, checksummed migrations, safe to run concurrently: the engine's (sql/migrations), then those of
the parts a project declares (core/wings.py: a wing's folder under sql/, recorded as "<part>/<version>").

Its own statements are bootstrap.sql's, run through queries.py rather than core/storage/table.py:
they run before the schema that table.py's statements need exists.
"""

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.migration_safety import (
    LockWaits,
    check_server_version,
    direct_connection_url,
    run_with_lock_waits,
)
from outbox_pipelines.core.storage.online_steps import run_outside_a_transaction, runs_outside_a_transaction, statements
from outbox_pipelines.core.storage.queries import named_queries, shared_query, sql_dir

# Any constant shared by every process that migrates this database.
MIGRATION_LOCK_KEY = 0x0B0C5_0001

# Engine migrations whose text changed once, on purpose, with what a database migrated before recorded: before 0.1.0
# the example tables and the order product's moved to opt-in parts (sql/parts/). A database that ran the earlier
# text keeps those tables; the new text creates none of them. Any other change to an applied file is refused.
EARLIER_CHECKSUMS = {
    "0001": "3f90194588d94adaa82e00046b2a60a754694c7918076fa495de19548b6eb5e6",
    "0002": "9563da46e95bbc5e2eef355510dd2abe5b732f0f6cac73b9be28f27e0d496c7b",
    "0003": "6c48cdb41c18474b3d464ce1ccdbd0fe56517941b6966d4cccb0bd8424b9ae0c",
    "0005": "8032bbc459a7dab66c82e55f1daec31e28b6102025db1cd79c6b908e6e913988",
    "0007": "2b520d03f5b7081d84d68297740cca15a21ac831b582ea9d96ec1da150c7cd80",
}


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover(directory: Path | None = None, *, part: str = "") -> list[Migration]:
    """The migrations in ``directory`` (the engine's by default) in order; a part's versions are "<part>/NNNN"."""
    directory = directory or sql_dir() / "migrations"
    found = []
    for path in sorted(directory.glob("*.sql")):
        version, _, rest = path.stem.partition("_")
        if not version.isdigit():
            raise MigrationError(f"migration file {path.name} must start with a number, like 0003_add_x.sql")
        prefix = f"{part}/" if part else ""
        found.append(Migration(prefix + version, prefix + path.name, path, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number in {directory}")
    return found


def _run(conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One bootstrap.sql statement; its rows as dicts (none for a statement that returns nothing)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(name), params)
        return cur.fetchall() if cur.description else []


def planned(directory: Path | None = None, parts: Iterable[str] = ()) -> list[Migration]:
    """The engine's migrations, then each declared part's (their tables are made by the engine's functions)."""
    found = discover(directory)
    for part, folder in wings.migration_folders(parts).items():
        found += discover(sql_dir() / folder, part=part)
    return found


def _check_unchanged(migration: Migration, recorded_checksum: str) -> None:
    if recorded_checksum not in (migration.checksum, EARLIER_CHECKSUMS.get(migration.version)):
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
    except psycopg.errors.LockNotAvailable:
        raise  # rolled back; migration_safety tries it again after a backoff
    except psycopg.Error as exc:
        raise MigrationError(f"migration {migration.name} failed and was rolled back: {exc}") from exc


def _apply_outside_a_transaction(conn: psycopg.Connection, migration: Migration, waits: LockWaits) -> None:
    """A ``-- outbox: no transaction`` migration: each statement on its own under the lock waits, then the record.
    Interrupted, it is not recorded, and a rerun repeats its (idempotent) statements."""
    try:
        run_outside_a_transaction(
            conn,
            migration.sql,
            lambda step: run_with_lock_waits(conn, migration.name, step, waits, clock=time.monotonic),
        )
        _run(
            conn,
            "outbox_schema_migrations_record",
            {"version": migration.version, "name": migration.name, "checksum": migration.checksum},
        )
    except psycopg.Error as exc:
        raise MigrationError(
            f"migration {migration.name} failed at one of its steps (each runs on its own; run db upgrade again "
            f"to repeat them): {exc}"
        ) from exc


def upgrade(
    url: str, directory: Path | None = None, parts: Iterable[str] = (), *, waits: LockWaits | None = None
) -> list[str]:
    """Apply every migration not yet applied (the engine's, then ``parts``'); return the names applied now.
    Refused on an unsupported server or through a transaction pooler; each migration waits for its locks
    as ``waits`` says (migration_safety.py)."""
    migrations = planned(directory, parts)
    waits = waits or LockWaits.from_env()
    applied_now: list[str] = []
    with connect(url) as probe:
        check_server_version(_run(probe, "server_version_num")[0]["num"])
        url = direct_connection_url(probe, url)
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
                if runs_outside_a_transaction(migration.sql):
                    _apply_outside_a_transaction(conn, migration, waits)
                else:
                    run_with_lock_waits(
                        conn, migration.name, partial(_apply, conn, migration), waits, clock=time.monotonic
                    )
                applied_now.append(migration.name)
        finally:
            _run(conn, "outbox_schema_migrations_unlock", {"key": MIGRATION_LOCK_KEY})
    return applied_now


def pending_migrations(url: str, directory: Path | None = None, parts: Iterable[str] = ()) -> list[Migration]:
    """The migrations ``upgrade`` would apply now, in order."""
    with connect(url) as conn:
        applied = _applied_versions(conn)
    return [m for m in planned(directory, parts) if m.version not in applied]


def pending(url: str, directory: Path | None = None, parts: Iterable[str] = ()) -> list[str]:
    return [m.name for m in pending_migrations(url, directory, parts)]


def applied(url: str) -> tuple[str, list[str]]:
    """The server's version, and the names of the migrations applied to its database, in order."""
    with connect(url) as conn:
        server = str(_run(conn, "server_version")[0]["server_version"])
        if not _run(conn, "outbox_schema_migrations_exists")[0]["ok"]:
            return server, []
        rows = sorted(_run(conn, "outbox_schema_migrations_applied"), key=lambda row: str(row["version"]))
    return server, [str(row["name"]) for row in rows]


def invalid_indexes(url: str) -> list[tuple[str, str]]:
    """(index, table) of every INVALID index of the schema: what an interrupted concurrent build leaves."""
    with connect(url) as conn:
        return [(str(row["index_name"]), str(row["table_name"])) for row in _run(conn, "invalid_indexes")]


def _applied_versions(conn: psycopg.Connection) -> set[str]:
    if not _run(conn, "outbox_schema_migrations_exists")[0]["ok"]:
        return set()
    return {row["version"] for row in _run(conn, "outbox_schema_migrations_applied")}


def as_sql_script(migrations: Iterable[Migration], lock_timeout_s: float) -> str:
    """``migrations`` as one SQL script for a team's own migration tool: each in its transaction, under the lock
    timeout ``upgrade`` uses, recorded as ``upgrade`` records it (so ``upgrade`` later sees it applied)."""
    blocks = [f"-- the record of applied migrations\n{named_queries()['outbox_schema_migrations_create']};\n"]
    for m in migrations:
        record = (
            "INSERT INTO outbox_schema_migrations (version, name, checksum) "
            f"VALUES ('{m.version}', '{m.name}', '{m.checksum}');"  # from our own files, never from input
        )
        timeout = f"lock_timeout = '{round(lock_timeout_s * 1000)}ms'"
        if runs_outside_a_transaction(m.sql):  # each statement on its own, never inside BEGIN ... COMMIT
            steps = "\n".join(statements(m.sql))
            blocks.append(f"-- {m.name} (outside a transaction: each statement on its own)\nSET {timeout};\n{steps}\n")
            blocks.append(f"{record}\nRESET lock_timeout;\n")
            continue
        blocks.append(
            f"-- {m.name} (in one transaction)\nBEGIN;\nSET LOCAL {timeout};\n{m.sql.strip()}\n{record}\nCOMMIT;\n"
        )
    return "\n".join(blocks)


# The engine schema this code needs: its newest migration (a part's are checked by the part's own commands).
def needed_version() -> str:
    return discover()[-1].version


_checked: set[str] = set()


def require_current_schema(url: str) -> None:
    """MigrationError when the database lacks an engine migration this code needs, once per database and
    process (a relay's start, not each message). A login that may not read the migrations is not checked."""
    if url in _checked:
        return
    try:
        with connect(url) as conn:
            applied = _applied_versions(conn)
    except psycopg.errors.InsufficientPrivilege:
        return
    missing = [m.name for m in discover() if m.version not in applied]
    if missing:
        at = max((v for v in applied if "/" not in v), default="none")
        raise MigrationError(
            f"the database schema is at {at}, this version needs {needed_version()} ({', '.join(missing)} not "
            "applied): run 'outbox-pipelines db upgrade'"
        )
    _checked.add(url)
