"""Migration steps that must run outside a transaction, and the rules that keep a new migration online.

A migration file whose first line is ``-- outbox: no transaction`` runs statement by statement, each on its own
(``CREATE INDEX CONCURRENTLY`` cannot run in a transaction block), each statement ending a line with ``;``. Before
``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name``, an INVALID index of that name (what an interrupted
concurrent build leaves) is dropped concurrently, so the rerun builds it again instead of keeping a useless one.
The migration is recorded once every statement has run; a rerun repeats them all, so each must be idempotent.

``blocking_statements`` names what in a migration would hold the application's writes for as long as the table
is large (docs: CONTRIBUTING.md, "Writing a migration"); outbox_pipelines_tests/core/test_online_steps.py runs it
over every migration added after the ones shipped before it existed.
"""

import re
from collections.abc import Callable

import psycopg
from psycopg import sql

from outbox_pipelines.core.storage.queries import shared_query

NO_TRANSACTION = "-- outbox: no transaction"
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+([a-z_][a-z0-9_]{0,62})\b", re.I
)
# (pattern, why it blocks, what to write instead); matched on the text without comments.
_BLOCKING = (
    (
        re.compile(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?!CONCURRENTLY)", re.I),
        "CREATE INDEX without CONCURRENTLY locks out every write for the whole build",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS, in a migration marked '-- outbox: no transaction'",
    ),
    (
        re.compile(r"(?:DROP|REINDEX)\s+INDEX\s+(?!CONCURRENTLY)", re.I),
        "DROP INDEX / REINDEX without CONCURRENTLY takes an exclusive lock",
        "DROP INDEX CONCURRENTLY IF EXISTS (or REINDEX INDEX CONCURRENTLY), outside a transaction",
    ),
    (
        re.compile(r"ADD\s+CONSTRAINT\s+\w+\s+(?:CHECK|FOREIGN\s+KEY)(?![^;]*NOT\s+VALID)", re.I),
        "a CHECK or FOREIGN KEY constraint checks every row under its lock",
        "ADD CONSTRAINT ... NOT VALID, then VALIDATE CONSTRAINT in a later statement",
    ),
    (
        re.compile(r"ALTER\s+COLUMN\s+\w+\s+(?:SET\s+DATA\s+)?TYPE\b", re.I),
        "changing a column's type rewrites the table under an exclusive lock",
        "a new column, filled in batches, then a switch-over",
    ),
    (
        re.compile(r"SET\s+NOT\s+NULL", re.I),
        "SET NOT NULL scans every row under an exclusive lock",
        "a CHECK (col IS NOT NULL) NOT VALID constraint, validated, then SET NOT NULL",
    ),
    (
        re.compile(r"\b(?:VACUUM\s+FULL|CLUSTER|LOCK\s+TABLE)\b", re.I),
        "VACUUM FULL, CLUSTER and LOCK TABLE hold an exclusive lock for as long as they run",
        "nothing of the kind in a migration",
    ),
)


def runs_outside_a_transaction(migration_sql: str) -> bool:
    return migration_sql.lstrip().startswith(NO_TRANSACTION)


def statements(migration_sql: str) -> list[str]:
    """The statements of a no-transaction migration: each ends a line with ``;`` (no function bodies here)."""
    found: list[str] = []
    current: list[str] = []
    for line in migration_sql.splitlines():
        if not current and (not line.strip() or line.strip().startswith("--")):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            found.append("\n".join(current).strip())
            current = []
    if current and "\n".join(current).strip():
        found.append("\n".join(current).strip())
    return found


def run_outside_a_transaction(
    conn: psycopg.Connection, migration_sql: str, run_statement: Callable[[Callable[[], None]], None]
) -> None:
    """Each statement on its own (autocommit), through ``run_statement`` (the lock-timeout retries); an INVALID
    index a concurrent build left is dropped first so that the statement builds it again."""
    for statement in statements(migration_sql):
        index = _CONCURRENT_INDEX.search(statement)

        def step(statement: str = statement, index: re.Match[str] | None = index) -> None:
            if index is not None and conn.execute(shared_query("index_is_invalid"), {"name": index[1]}).fetchone():
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index[1])))
            conn.execute(statement.encode())

        run_statement(step)


def blocking_statements(migration_sql: str) -> list[str]:
    """What in ``migration_sql`` would hold the application's writes as long as the table is large, each with
    what to write instead; also a concurrent index build in a migration that runs in a transaction."""
    text = "\n".join(line.split("--", 1)[0] for line in migration_sql.splitlines())
    found = [f"{why}: write {instead}" for pattern, why, instead in _BLOCKING if pattern.search(text)]
    if re.search(r"CONCURRENTLY", text, re.I) and not runs_outside_a_transaction(migration_sql):
        found.append(f"CONCURRENTLY cannot run in a transaction: write '{NO_TRANSACTION}' as the file's first line")
    return found
