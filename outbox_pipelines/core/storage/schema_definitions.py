"""What the migrations define, read from their text: each ``outbox_*`` function's body as the database keeps it
(``pg_proc.prosrc``: the text between the dollar quotes), and the indexes ``outbox_create_table`` gives every outbox
table (the suffixes it passes to ``outbox_index_name``, and each index's statement, built concurrently). The drift
check (schema_drift.py) compares the database with these; nothing here is written twice: a new index in
``outbox_create_table`` (or ``outbox_create_ordering``, which it performs) is one the check expects.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from psycopg import sql

from outbox_pipelines.core.storage.migration_files import Migration

# The function that makes an outbox table, and the functions of its own it performs (found in its body).
CREATE_TABLE = "outbox_create_table"

_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
_FUNCTION = re.compile(
    r"^\s*(?:--[^\n]*\n\s*)*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)\s*\(", re.I | re.S
)
_BODY = re.compile(r"\bAS\s+(\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$)(.*?)\1", re.S)
_PERFORMED = re.compile(r"\bPERFORM\s+(outbox_create_[a-z0-9_]+)\s*\(", re.I)
_LITERALS = r"'(?:[^']|'')*'(?:\s*'(?:[^']|'')*')*"
# EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I ...', outbox_index_name(table_name, 'suffix'), table_name)
_INDEX = re.compile(
    rf"EXECUTE\s+format\(\s*(?P<literals>{_LITERALS})\s*,\s*outbox_index_name\(table_name,\s*'(?P<suffix>\w+)'\)"
    r"\s*,\s*table_name\s*\)",
    re.S,
)
# The table's own statement: format($ddl$ CREATE TABLE ... CONSTRAINT %I UNIQUE (cols) ... $ddl$, table_name,
# outbox_index_name(table_name, 'suffix')): the unique constraint's index.
_TABLE = re.compile(
    r"format\(\s*(\$\w*\$)(?P<ddl>.*?)\1\s*,\s*table_name\s*,\s*outbox_index_name\(table_name,\s*'(?P<suffix>\w+)'\)",
    re.S,
)
_UNIQUE = re.compile(r"CONSTRAINT\s+%I\s+UNIQUE\s*\((?P<columns>[^)]*)\)")
_OPTIONAL = re.compile(r"\bIF\s+with_dedup_index\s+THEN\b(.*?)\bEND\s+IF\b", re.S | re.I)


@dataclass(frozen=True)
class FunctionDefinition:
    name: str
    body: str  # as pg_proc.prosrc keeps it
    security_definer: bool
    migration: str  # the file that defines it last


@dataclass(frozen=True)
class IndexDefinition:
    """An index every outbox table has (``optional``: only when asked for, as the dedup index)."""

    suffix: str
    template: str  # the statement with %I for the index, then the table
    optional: bool = False
    unique_constraint: bool = False

    def statement(self, index_name: str, table_name: str) -> sql.Composed:
        """The statement that builds it on a table without stopping writes (CONCURRENTLY, outside a transaction)."""
        parts = [sql.Identifier(index_name), sql.Identifier(table_name)]
        if self.unique_constraint:
            text = (
                "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {0} ON {1} (" + self.template + "); "
                "ALTER TABLE {1} ADD CONSTRAINT {0} UNIQUE USING INDEX {0}"
            )
            return sql.SQL(text).format(*parts)
        text = self.template.replace("{", "{{").replace("}", "}}").replace("%I", "{}")
        text = re.sub(r"^CREATE\s+INDEX\s+IF\s+NOT\s+EXISTS", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", text)
        return sql.SQL(text).format(*parts)


def top_level_statements(text: str) -> list[str]:
    """The statements of a SQL file, split at the semicolons outside comments, quotes and dollar quotes."""
    found, start, i, n = [], 0, 0, len(text)
    while i < n:
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif text[i] in "'\"":
            i = _after_quoted(text, i)
        elif text[i] == "$" and (tag := _DOLLAR_TAG.match(text, i)) and not (i and (text[i - 1].isalnum())):
            end = text.find(tag.group(0), tag.end())
            i = n if end < 0 else end + len(tag.group(0))
        else:
            if text[i] == ";":
                found.append(text[start:i])
                start = i + 1
            i += 1
    if text[start:].strip():
        found.append(text[start:])
    return found


def _after_quoted(text: str, i: int) -> int:
    quote, i = text[i], i + 1
    while i < len(text):
        if text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
                continue
            return i + 1
        i += 1
    return i


def functions_of(migration: Migration) -> dict[str, FunctionDefinition]:
    """The functions ``migration`` defines at its top level, by name (those a function makes at run time are
    left out: their text depends on the table they are made for)."""
    found = {}
    for text in top_level_statements(migration.sql):
        head = _FUNCTION.match(text)
        body = _BODY.search(text, head.end()) if head else None
        if head and body:
            header = text[: body.start()]
            secdef = bool(re.search(r"\bSECURITY\s+DEFINER\b", header, re.I))
            found[head.group(1)] = FunctionDefinition(head.group(1), body.group(2), secdef, migration.name)
    return found


def defined_functions(migrations: Iterable[Migration]) -> dict[str, FunctionDefinition]:
    """Each function as the last of ``migrations`` (in order) that defines it defines it."""
    found: dict[str, FunctionDefinition] = {}
    for migration in migrations:
        found.update(functions_of(migration))
    return found


def table_indexes(functions: dict[str, FunctionDefinition]) -> list[IndexDefinition]:
    """The indexes ``outbox_create_table`` gives a table, with those of the functions it performs."""
    found: list[IndexDefinition] = []
    pending, seen = [CREATE_TABLE], set()
    while pending:
        name = pending.pop(0)
        if name in seen or name not in functions:
            continue
        seen.add(name)
        body = functions[name].body
        optional = [m.span(1) for m in _OPTIONAL.finditer(body)]
        for match in _TABLE.finditer(body):
            if unique := _UNIQUE.search(match.group("ddl")):
                found.append(IndexDefinition(match.group("suffix"), unique.group("columns"), unique_constraint=True))
        for match in _INDEX.finditer(body):
            template = "".join(part[1:-1].replace("''", "'") for part in re.findall(r"'(?:[^']|'')*'", match[1]))
            inside = any(start <= match.start() < end for start, end in optional)
            found.append(IndexDefinition(match.group("suffix"), template, optional=inside))
        pending += _PERFORMED.findall(body)
    return found
