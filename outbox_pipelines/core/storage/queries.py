"""Named queries from sql/queries/*.sql, composed per table with a quoted identifier.

Loading and composing only: ``OutboxTable`` and ``SharedTables`` (core/storage/table*.py,
shared_tables.py) run them (bootstrap.sql's aside, which run before the schema exists:
core/storage/embedded.py, core/storage/migrate.py and defs/dagster_home.py), and the order wing
runs ledger.sql's.
"""

import re
from functools import cache, lru_cache
from pathlib import Path

from psycopg import sql

from outbox_pipelines.core.names import table_identifier


def sql_dir() -> Path:
    """sql/ in a source checkout, or the copy packaged inside the wheel."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[3] / "sql", here.parents[2] / "_sql"):
        if (candidate / "migrations").is_dir():
            return candidate
    raise FileNotFoundError("cannot find the sql/ directory of outbox_pipelines")


def parse_named_queries(text: str) -> dict[str, str]:
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-- name:"):
            name = stripped[len("-- name:") :].strip()
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice")
            current = queries[name] = []
        elif current is not None:
            current.append(line)
    return {name: _sent_text(lines) for name, lines in queries.items()}


def _sent_text(lines: list[str]) -> str:
    """A query as sent, without its comments: they explain it here, in sql/; sent, they made the relay's claims and
    settles longer than the 4 KB psycopg caches its parse of, so each run parsed 5 KB again on both sides; nor the
    indentation. Lines in a string literal that spans lines are kept as they are, and so is a line that holds a quote.
    """
    kept, quotes = [], 0
    for line in lines:
        if quotes % 2 == 0:  # not inside a literal: the indentation goes too
            line = line.strip()
            if line.startswith("--"):
                continue
            if "'" not in line and " --" in line:
                line = line[: line.index(" --")].rstrip()
        kept.append(line)
        quotes += line.count("'")
    return "\n".join(kept).strip()


@cache
def named_queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted((sql_dir() / "queries").glob("*.sql")):
        for name, text in parse_named_queries(path.read_text()).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined in more than one file")
            found[name] = text
    return found


@lru_cache(maxsize=1024)
def table_query(name: str, table_name: str) -> str:
    """The named query with ``{table}`` bound to the quoted table name (validated by ``OutboxTable``), and each
    ``{other_name}`` it holds bound to that named query (a part written once, such as ``claim_key_head``).

    Rendered to text once: psycopg then reuses its parse of the query (and its
    server-side prepared statement) instead of re-composing it on every call.
    """
    # Its name first: what pg_stat_activity shows of it.
    return f"-- {name}\n" + _composed(name, table_identifier(table_name)).as_string(None)


@lru_cache(maxsize=256)
def claim_query(name: str, table_name: str, limit: int) -> str:
    """A claim's ``table_query`` with its LIMIT written in as a number, so that its kept (generic) plan knows how few
    rows it takes: with a parameter there, PostgreSQL plans for a tenth of the due rows, and sorting them all can then
    look cheaper than reading the index in id order (sql/'s claim_due: why the topic is an expression, likewise)."""
    if type(limit) is not int or limit < 0:
        raise ValueError(f"a claim's limit is a count of rows, not {limit!r}")
    return table_query(name, table_name).replace("%(limit)s", str(limit))


_PART = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")


def _composed(name: str, table: sql.Identifier) -> sql.Composed:
    text = named_queries()[name]
    parts = {part: _composed(part, table) for part in _PART.findall(text) if part != "table"}
    return sql.SQL(text).format(table=table, **parts)


def shared_query(name: str) -> sql.SQL:
    return sql.SQL(f"-- {name}\n" + named_queries()[name])


# psycopg's placeholders: %s (positional), %(name)s (named), each also as %b (bound in binary), and %% (a
# literal %).
_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%[sb]|%%")


@lru_cache(maxsize=256)
def numbered_table_query(name: str, table_name: str) -> tuple[str, tuple[str, ...] | int]:
    """``table_query`` with asyncpg's placeholders (``$1``, ``$2``): the same statement from sql/, renumbered.

    Also returns how its parameters are passed: the names of ``%(name)s`` parameters in ``$n`` order (a
    name used twice is one ``$n``), or the count of positional ``%s`` parameters.
    """
    names: list[str] = []
    positional = 0

    def number(match: re.Match[str]) -> str:
        nonlocal positional
        if match.group(0) == "%%":
            return "%"
        if match.group(1) is None:
            positional += 1
            return f"${positional}"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, table_query(name, table_name))
    if names and positional:
        raise ValueError(f"query {name!r} mixes %s and %(name)s placeholders")
    return text, tuple(names) if names else positional
