"""Migration steps that must run outside a transaction, and the rules that keep a new migration online.

A file starting ``-- outbox: no transaction`` runs statement by statement; every step must be idempotent (a rerun
repeats them all). ``blocking_statements`` names what would hold the application's writes.
How: docs/explanation/storage.md, "Migrations that stay online".
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from outbox_pipelines.core.storage.queries import shared_query

NO_TRANSACTION = "-- outbox: no transaction"
GENERATES = "-- outbox: run each statement this query returns"
_DOLLAR_QUOTE = re.compile(r"\$[A-Za-z_]*\$")
# The body of a function a migration defines: what it runs when called, not when the migration runs (judged where
# a migration calls it: 0014's generated ``SELECT outbox_create_ordering(...)`` on each table, say).
_FUNCTION_BODY = re.compile(
    r"(CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\b.*?\bAS\s+)(\$[A-Za-z_]*\$).*?\2", re.I | re.S
)
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


@dataclass(frozen=True)
class Statement:
    text: str
    generates: bool = False  # a query whose rows (one text each) are the statements to run


def parsed(migration_sql: str) -> list[Statement]:
    """The statements of a no-transaction migration, in order (comments between them left out)."""
    found: list[Statement] = []
    current: list[str] = []
    generates = False
    open_tag: str | None = None  # the dollar quote a function body is in: its ';' end no statement
    for line in migration_sql.splitlines():
        if not current and (not line.strip() or line.strip().startswith("--")):
            generates = generates or line.strip() == GENERATES
            continue
        current.append(line)
        for tag in _DOLLAR_QUOTE.findall(line.split("--", 1)[0] if open_tag is None else line):
            open_tag = tag if open_tag is None else (None if tag == open_tag else open_tag)
        if open_tag is None and line.rstrip().endswith(";"):
            found.append(Statement("\n".join(current).strip(), generates))
            current, generates = [], False
    if current and "\n".join(current).strip():
        found.append(Statement("\n".join(current).strip(), generates))
    return found


def statements(migration_sql: str) -> list[str]:
    return [statement.text for statement in parsed(migration_sql)]


def concrete_statements(conn: psycopg.Connection, migration_sql: str) -> list[str]:
    """The steps as they would run on ``conn``'s database now: each generating query replaced by what it returns
    (for ``db upgrade --dry-run`` and ``--sql``). On a database the engine has not migrated yet, a generating query
    names functions that do not exist: there is no outbox table either, so it generates nothing."""
    found: list[str] = []
    for statement in parsed(migration_sql):
        try:
            found += _expanded(conn, statement)
        except (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedTable):
            continue
    return found


def _expanded(conn: psycopg.Connection, statement: Statement) -> list[str]:
    if not statement.generates:
        return [statement.text]
    with conn.cursor(row_factory=tuple_row) as cur:
        return [str(row[0]) + ";" for row in cur.execute(statement.text.encode()).fetchall()]


def is_concurrent(statement: str) -> bool:
    """A concurrent index build or drop: it waits for older transactions without holding up anyone's writes, so
    it is given the whole wait instead of the short lock timeout that protects the application from DDL."""
    return bool(re.search(r"\bCONCURRENTLY\b", statement, re.I))


def run_outside_a_transaction(
    conn: psycopg.Connection, migration_sql: str, run_statement: Callable[[Callable[[], None], bool], None]
) -> None:
    """Each step on its own (autocommit), through ``run_statement(step, concurrent)`` (the lock-timeout retries);
    an INVALID index a concurrent build left is dropped first so that the step builds it again. A generating query
    runs when its turn comes, so it sees what the steps before it did."""
    for statement in parsed(migration_sql):
        for text in _expanded(conn, statement):
            index = _CONCURRENT_INDEX.search(text)

            def step(text: str = text, index: re.Match[str] | None = index) -> None:
                if index is not None and conn.execute(shared_query("index_is_invalid"), {"name": index[1]}).fetchone():
                    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index[1])))
                conn.execute(text.encode())

            run_statement(step, is_concurrent(text))


def blocking_statements(migration_sql: str) -> list[str]:
    """What in ``migration_sql`` would hold the application's writes as long as the table is large, each with
    what to write instead; also a concurrent index build in a migration that runs in a transaction."""
    text = "\n".join(line.split("--", 1)[0] for line in migration_sql.splitlines())
    text = _FUNCTION_BODY.sub(r"\1''", text)
    found = [f"{why}: write {instead}" for pattern, why, instead in _BLOCKING if pattern.search(text)]
    if re.search(r"CONCURRENTLY", text, re.I) and not runs_outside_a_transaction(migration_sql):
        found.append(f"CONCURRENTLY cannot run in a transaction: write '{NO_TRANSACTION}' as the file's first line")
    return found
