"""The migrations of earlier versions, as the databases they migrated ran them."""

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from outbox_pipelines.core.storage import migrate
from outbox_pipelines.core.storage.migration_safety import LockWaits

# The engine files that changed since 0.1 as they were before (when the order product and the examples became parts,
# and when 0010 and 0012 stopped holding the writes): with today's other files up to 0012, what every database
# migrated by then ran (their tables included).
CHANGED_FOR_PARTS = Path(__file__).resolve().parents[1] / "fixtures" / "migrations_0_1"


def migrations_before_parts(tmp_path, last: str = "0012") -> Path:
    """The migrations of the version before parts, up to and including ``last``, in a directory of their own."""
    folder = tmp_path / f"before_parts_to_{last}"
    folder.mkdir()
    for migration in migrate.discover():
        if migration.version <= last:
            earlier = CHANGED_FOR_PARTS / migration.name
            shutil.copy(earlier if earlier.is_file() else migration.path, folder / migration.name)
    return folder


def upgrade_to_before(url: str, tmp_path: Path, version: str) -> None:
    """Migrate the database at ``url`` as the version before ``version`` did: today's files before it, in a directory
    of their own (a test of what ``version`` does to a database of the version before)."""
    folder = tmp_path / f"before_{version}"
    folder.mkdir()
    for migration in migrate.discover():
        if migration.version < version:
            shutil.copy(migration.path, folder / migration.name)
    migrate.upgrade(url, folder)


def upgrade_beside_a_writer(
    url: str, write: Callable[[psycopg.Connection], object], *, contract: bool = False
) -> list[str]:
    """``db upgrade`` (``--contract``) while a transaction that ran ``write`` holds its locks open, under a short lock
    timeout: the steps applied. Raises AssertionError when the upgrade took a second or more (it waited)."""
    holder = psycopg.connect(url)
    try:
        write(holder)
        started = time.monotonic()
        applied = migrate.upgrade(url, waits=LockWaits(lock_timeout_s=0.2, give_up_after_s=1), contract=contract)
        assert time.monotonic() - started < 1.0, "the upgrade waited for the writer's transaction"
    finally:
        holder.rollback()
        holder.close()
    return applied


def keyed_table_before(url: str, tmp_path: Path, version: str, table: str) -> str:
    """A database of the version before ``version`` with ``table``, autovacuum off (the statistics are the test's)."""
    upgrade_to_before(url, tmp_path, version)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT outbox_create_table(%s)", (table,))
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")  # a test's table name, not input
    return url


def insert_keyed(table: str) -> str:
    """Keyed rows as any writer inserts them, whatever the version's enqueue (%(tag)s-n, key k-(n %% keys))."""
    return (
        f"INSERT INTO {table} (event_id, topic, payload, payload_sha, headers, ordering_key) "
        "SELECT %(tag)s || '-' || n, 't', '{}'::jsonb, 'sha', '{}'::jsonb, 'k-' || (n %% %(keys)s) "
        "FROM generate_series(1, %(count)s) AS n ORDER BY n"
    )
