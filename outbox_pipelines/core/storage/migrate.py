"""Forward-only, checksummed migrations, safe to run concurrently: the engine's (sql/migrations), then those of
the parts a project declares (core/wings.py: a wing's folder under sql/, recorded as "<part>/<version>").

Its own statements are bootstrap.sql's, run through queries.py rather than core/storage/table.py:
they run before the schema that table.py's statements need exists.
"""

import time
from collections.abc import Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.lock_blockers import BlockerWatch
from outbox_pipelines.core.storage.migration_files import Migration, discover
from outbox_pipelines.core.storage.migration_safety import (
    LockWaits,
    check_server_version,
    direct_connection_url,
    run_with_lock_waits,
)
from outbox_pipelines.core.storage.online_steps import (
    concrete_statements,
    is_concurrent,
    run_outside_a_transaction,
    runs_outside_a_transaction,
)
from outbox_pipelines.core.storage.queries import named_queries, shared_query, sql_dir

# Any constant shared by every process that migrates this database.
MIGRATION_LOCK_KEY = 0x0B0C5_0001
UPGRADE_APPLICATION_NAME = "outbox-pipelines db upgrade"  # what pg_stat_activity shows for its session

# Engine migrations whose text changed once, on purpose, with what a database migrated before recorded: before 0.1.0
# the example tables and the order product's moved to opt-in parts (sql/parts/), and 0006, 0010 and 0012 stopped holding
# the application's writes (their table work runs concurrently, in 0016, 0014 and 0012's own steps). A database that
# ran the earlier text has what it made; the new text is for those that have not. Any other edit is refused.
EARLIER_CHECKSUMS = {
    "0001": "3f90194588d94adaa82e00046b2a60a754694c7918076fa495de19548b6eb5e6",
    "0002": "9563da46e95bbc5e2eef355510dd2abe5b732f0f6cac73b9be28f27e0d496c7b",
    "0003": "6c48cdb41c18474b3d464ce1ccdbd0fe56517941b6966d4cccb0bd8424b9ae0c",
    "0005": "8032bbc459a7dab66c82e55f1daec31e28b6102025db1cd79c6b908e6e913988",
    "0006": "e762c6e1f91da7467d789a40c05b0ec932b4e9cf57fd2cac89e3fdb8fe903c47",
    "0007": "2b520d03f5b7081d84d68297740cca15a21ac831b582ea9d96ec1da150c7cd80",
    "0010": "ceb4a8441b09c86e48d8604352b5297a4b4e6a2521e07d17e927d8be653a94a9",
    "0012": "6044a5154b2aadf7e9554955753ea4afa41a74ad95eb8600680eaa4b93b570df",
}


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


def contract_steps() -> list[Migration]:
    """The contract steps (sql/contract, recorded as "contract/NNNN"): what an expand left for later, such as an
    index only the previous version's relays use. Run by ``upgrade(contract=True)`` once no old relay runs."""
    return discover(sql_dir() / "contract", part="contract")


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


def _apply_outside_a_transaction(
    conn: psycopg.Connection, migration: Migration, waits: LockWaits, watch: BlockerWatch | None = None
) -> None:
    """A ``-- outbox: no transaction`` migration: each statement on its own under the lock waits, then the record.
    Interrupted, it is not recorded, and a rerun repeats its (idempotent) statements."""
    try:
        run_outside_a_transaction(
            conn,
            migration.sql,
            lambda step, concurrent: run_with_lock_waits(
                conn,
                migration.name,
                step,
                waits.for_concurrent() if concurrent else waits,
                clock=time.monotonic,
                watch=watch,
            ),
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


def _take_the_migration_lock(conn: psycopg.Connection) -> None:
    """The session lock that serialises concurrent upgrades (the loser then sees the winner's rows), polled
    rather than waited for: a session blocked in one statement holds a snapshot, and the winner's concurrent
    index builds would wait for it while it waits for them."""
    while not _run(conn, "outbox_schema_migrations_lock", {"key": MIGRATION_LOCK_KEY})[0]["locked"]:
        time.sleep(0.2)


def upgrade(
    url: str,
    directory: Path | None = None,
    parts: Iterable[str] = (),
    *,
    waits: LockWaits | None = None,
    contract: bool = False,
    settings: Mapping[str, str] | None = None,
) -> list[str]:
    """Apply every migration not yet applied (the engine's, then ``parts``'); return the names applied now.
    ``contract``: the contract steps instead, refused while an expand step is pending or a relay started before
    the last one still runs. Refused on an unsupported server or through a transaction pooler; each migration
    waits for its locks as ``waits`` says (migration_safety.py). ``settings``: session settings a migration reads
    (``current_setting``), such as the payload limit 0020 gives the tables (storage/payload_limit.py)."""
    migrations = contract_steps() if contract else planned(directory, parts)
    waits = waits or LockWaits.from_env()
    applied_now: list[str] = []
    with connect(url) as probe:
        check_server_version(_run(probe, "server_version_num")[0]["num"])
        url = direct_connection_url(probe, url)
    with connect(url, application_name=UPGRADE_APPLICATION_NAME) as conn, BlockerWatch.open(url) as watch:
        _run(conn, "migration_session_set")
        _set(conn, settings)
        _take_the_migration_lock(conn)
        try:
            # Created only when missing: CREATE TABLE IF NOT EXISTS needs CREATE on the schema even when the
            # table exists, which the Order API's role (db grant) does not hold.
            if not _run(conn, "outbox_schema_migrations_exists")[0]["ok"]:
                _run(conn, "outbox_schema_migrations_create")
            checksums = {row["version"]: row["checksum"] for row in _run(conn, "outbox_schema_migrations_applied")}
            if contract:
                _check_ready_to_contract(conn, planned(directory, parts), checksums)
            for migration in migrations:
                if migration.version in checksums:
                    _check_unchanged(migration, checksums[migration.version])
                    continue
                if runs_outside_a_transaction(migration.sql):
                    _apply_outside_a_transaction(conn, migration, waits, watch)
                else:
                    run_with_lock_waits(
                        conn, migration.name, partial(_apply, conn, migration), waits, clock=time.monotonic, watch=watch
                    )
                applied_now.append(migration.name)
            if not contract and directory is None and "0001" not in checksums and applied_now:
                _contract_a_new_database(conn, waits, watch)
        finally:
            _run(conn, "outbox_schema_migrations_unlock", {"key": MIGRATION_LOCK_KEY})
    return applied_now


def _contract_a_new_database(conn: psycopg.Connection, waits: LockWaits, watch: BlockerWatch) -> None:
    """A database created now has nothing of an earlier version to keep: its contract steps are recorded with the
    expand (each finds nothing to do), so that db status does not ask for one."""
    for step in contract_steps():
        _apply_outside_a_transaction(conn, step, waits, watch)


def _check_ready_to_contract(conn: psycopg.Connection, expand: list[Migration], applied: dict[str, str]) -> None:
    """MigrationError unless every expand step is applied and no relay started before the last one still runs."""
    if missing := [m.name for m in expand if m.version not in applied]:
        raise MigrationError(
            f"expand first: {', '.join(missing)} not applied; run 'outbox-pipelines db upgrade', move every relay "
            "and producer to this version, then 'db upgrade --contract'. Nothing was applied."
        )
    if old := _run(conn, "relays_started_before_the_schema"):
        names = "; ".join(f"{r['worker']} on {r['table_name']} (host {r['host']}, pid {r['pid']})" for r in old[:5])
        raise MigrationError(
            f"{len(old)} relay(s) started before the last upgrade still run and may be the previous version: {names}. "
            "Restart them on this version (or wait until they stop), then run 'db upgrade --contract' again. "
            "Nothing was applied."
        )


def pending_contract_steps(url: str) -> list[Migration]:
    """The contract steps not applied yet (db status names them)."""
    with connect(url) as conn:
        applied = _applied_versions(conn)
    return [m for m in contract_steps() if m.version not in applied]


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


def _set(conn: psycopg.Connection, settings: Mapping[str, str] | None) -> None:
    for name, value in (settings or {}).items():
        _run(conn, "migration_setting_set", {"name": name, "value": value})


def concrete_steps(
    url: str, migrations: Iterable[Migration], settings: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    """The steps of each no-transaction migration of ``migrations`` as they would run on ``url``'s database now
    (a generating query replaced by the statements it returns: one per outbox table there), with ``settings``
    as ``upgrade`` would set them."""
    outside = [m for m in migrations if runs_outside_a_transaction(m.sql)]
    if not outside:
        return {}
    with connect(url) as conn:
        _set(conn, settings)
        return {m.version: concrete_statements(conn, m.sql) for m in outside}


def as_sql_script(migrations: Iterable[Migration], lock_timeout_s: float, steps: dict[str, list[str]]) -> str:
    """``migrations`` as one SQL script for a team's own migration tool: each in its transaction, under the lock
    timeout ``upgrade`` uses, recorded as ``upgrade`` records it (so ``upgrade`` later sees it applied). A
    no-transaction migration is its ``steps`` (concrete_steps), each on its own; a concurrent build without the
    lock timeout (it holds up no write)."""
    blocks = [f"-- the record of applied migrations\n{named_queries()['outbox_schema_migrations_create']};\n"]
    timeout = f"SET lock_timeout = '{round(lock_timeout_s * 1000)}ms';"
    for m in migrations:
        record = (
            "INSERT INTO outbox_schema_migrations (version, name, checksum) "
            f"VALUES ('{m.version}', '{m.name}', '{m.checksum}');"  # from our own files, never from input
        )
        if runs_outside_a_transaction(m.sql):  # each statement on its own, never inside BEGIN ... COMMIT
            lines = [f"-- {m.name} (outside a transaction: each statement on its own)"]
            for statement in steps[m.version]:
                lines += ["SET lock_timeout = 0;" if is_concurrent(statement) else timeout, statement]
            blocks.append("\n".join([*lines, record, "RESET lock_timeout;"]) + "\n")
            continue
        blocks.append(
            f"-- {m.name} (in one transaction)\nBEGIN;\nSET LOCAL {timeout[4:]}\n{m.sql.strip()}\n{record}\nCOMMIT;\n"
        )
    return "\n".join(blocks)


# The engine schema this code needs: its newest migration (a part's are checked by the part's own commands).
def needed_version() -> str:
    return discover()[-1].version
