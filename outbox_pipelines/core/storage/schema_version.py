"""The engine schema this code needs against the one a database has: one sentence when the database is behind.

Readable by any login (``outbox_schema_version``, migration 0015); the probe asks the catalogs first, so nothing it
reads can abort the transaction it runs in (an enqueue's, core/enqueue_guard.py). ``db status`` and the
``schema_version`` check say the same sentence.
"""

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.migration_files import discover
from outbox_pipelines.core.storage.queries import named_queries

# The migration that made the applied versions readable by every login: a database without its view is older.
VIEW_VERSION = "0015"
PROBE = "schema_version_probe"
OF_VIEW = "schema_versions_of_view"
OF_RECORD = "schema_versions_of_record"


@dataclass(frozen=True)
class AppliedVersions:
    """What a login found of the applied migrations: ``versions`` None when it may read neither the view nor the
    record; ``server_pid``, the server's pid for the session (a pooler reports another at connect)."""

    versions: frozenset[str] | None
    view_exists: bool
    record_exists: bool
    server_pid: int
    record_readable: bool = False  # the record itself, with its checksums (schema_drift.py compares functions)


@cache
def needed() -> tuple[tuple[str, str], ...]:
    """(version, file name) of every engine migration this code needs, in order (a part's are the part's own)."""
    return tuple((m.version, m.name) for m in discover())


def behind(applied: AppliedVersions) -> str | None:
    """The sentence that says the database lacks engine migrations this code needs, and what to do; None when it
    has them all, or when this login can tell neither way (the view exists but may not be read)."""
    migrations = needed()
    if applied.versions is not None:
        engine = {version for version in applied.versions if "/" not in version}
        missing = [name for version, name in migrations if version not in engine]
        # The version the schema is complete up to: the one before the first missing migration.
        first_missing = min((v for v, _ in migrations if v not in engine), default="")
        at = max((v for v, _ in migrations if v in engine and v < first_missing), default="none")
    elif applied.view_exists:
        return None
    else:
        missing = [name for version, name in migrations if version >= VIEW_VERSION]
        at = f"a version before {VIEW_VERSION}"
    if not missing:
        return None
    return (
        f"the database schema is at {at}, this version needs {migrations[-1][0]} ({', '.join(missing)} not "
        "applied): run 'outbox-pipelines db upgrade'"
    )


def statement(name: str) -> str:
    """A statement of sql/queries/schema.sql as text: none takes a parameter, so every driver runs it as it is."""
    return named_queries()[name]


def versions_statement(probe: Sequence[Any]) -> str | None:
    """Which statement reads the versions, given the row of schema_version_probe; None: this login may read none."""
    _, view_readable, _, record_readable, _ = probe
    return OF_VIEW if view_readable else OF_RECORD if record_readable else None


def applied_from(probe: Sequence[Any], versions: Sequence[str] | None) -> AppliedVersions:
    """The row of schema_version_probe and what ``versions_statement`` read (None when it read nothing)."""
    view_exists, _, record_exists, record_readable, pid = probe
    found = frozenset(versions) if versions is not None else None
    if found is None and not view_exists and not record_exists:
        found = frozenset()  # nothing was ever applied
    return AppliedVersions(found, bool(view_exists), bool(record_exists), int(pid), bool(record_readable))


def read_applied(conn: psycopg.Connection[Any]) -> AppliedVersions:
    """The probe and the versions on ``conn``, never prepared (it may go through a transaction pooler), read as
    tuples whatever rows ``conn`` makes."""

    def run(name: str) -> Any:
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(statement(name), prepare=False)
            return cur.fetchone()

    probe = run(PROBE)
    name = versions_statement(probe)
    return applied_from(probe, run(name)[0] if name else None)


def schema_behind(conn: psycopg.Connection[Any]) -> str | None:
    """``behind`` for the database ``conn`` is connected to: what ``db status`` and the code location's check say."""
    return behind(read_applied(conn))


_current: set[str] = set()


def require_current_schema(url: str, conn: psycopg.Connection | None = None) -> None:
    """MigrationError with ``behind``'s sentence when the database at ``url`` lacks an engine migration this code
    needs; checked once per database and process (a relay's or a command's start, not each message); on ``conn``
    (a connection to ``url``) if given."""
    if url in _current:
        return
    with nullcontext(conn) if conn is not None else connect(url) as on:
        sentence = schema_behind(on)
    if sentence is not None:
        raise MigrationError(sentence)
    _current.add(url)
