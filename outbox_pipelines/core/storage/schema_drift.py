"""Drift: where a database that has every migration still differs from what they define, each with what it
breaks and what to do (``db status`` prints the sentences; the code location's ``schema_drift`` check fails on them).

Missing tables or indexes, changed ``outbox_*`` functions, missing rights, each computed from the migration
files: docs/explanation/storage.md, "Schema drift".
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.models import CheckSeverity
from outbox_pipelines.core.storage import migrate, roles
from outbox_pipelines.core.storage.migration_files import Migration
from outbox_pipelines.core.storage.queries import shared_query
from outbox_pipelines.core.storage.schema_definitions import (
    FunctionDefinition,
    defined_functions,
    functions_of,
    table_indexes,
)
from outbox_pipelines.core.storage.schema_version import read_applied

WARN, ERROR = CheckSeverity.WARN, CheckSeverity.ERROR
SCHEMA = ""  # the relation of a schema-wide right (USAGE on the schema)
SEQUENCE_USAGE = "SEQUENCE USAGE"  # USAGE on the id sequence of the table


@dataclass(frozen=True)
class Drift:
    kind: str  # table, index, invalid_index, function, grant
    subject: str
    sentence: str  # what, what it breaks, what to do
    severity: str  # warn: slower; error: something fails


def _rows(conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(name), params, prepare=False)
        return cur.fetchall() if cur.description else []


def find_drift(conn: psycopg.Connection[Any], tables: Sequence[str], parts: Iterable[str] = ()) -> list[Drift]:
    """Every drift of the database ``conn`` is on, for the declared ``tables`` and ``parts``; [] on a database not
    migrated at all (``db status`` says what is pending)."""
    applied = read_applied(conn)
    if not applied.record_exists or applied.versions is None:
        return []
    # The contract steps applied last: each redefines what its expand step left for the previous version.
    steps = [*migrate.planned(parts=parts), *migrate.contract_steps()]
    migrations = [m for m in steps if m.version in applied.versions]
    named = [row["name"] for row in _rows(conn, "schema_existing_tables", {"tables": list(tables)})]
    outboxes = {row["table_name"] for row in _rows(conn, "outbox_tables_list")}
    existing = [name for name in named if name in outboxes]  # a business table's name declared: not ours to fix
    found = [_missing_table(name) for name in tables if name not in named]
    found += [_not_an_outbox(name) for name in named if name not in outboxes]
    found += _index_drift(conn, existing, migrations)
    found += [
        Drift(
            "invalid_index",
            row["index_name"],
            f"index {row['index_name']} on {row['table_name']} is INVALID (an interrupted concurrent build; it is "
            f"never used): REINDEX INDEX CONCURRENTLY {row['index_name']}",
            WARN,
        )
        for row in _rows(conn, "invalid_indexes")
    ]
    found += _function_drift(conn, migrations) if applied.record_readable else []
    found += _grant_drift(conn, existing)
    return found


def _missing_table(name: str) -> Drift:
    return Drift(
        "table",
        name,
        f"outbox table {name} is declared but does not exist: its enqueues and its relay fail. Run 'outbox-pipelines "
        "db upgrade' (it creates the tables the project declares)",
        ERROR,
    )


def _not_an_outbox(name: str) -> Drift:
    return Drift(
        "table",
        name,
        f"{name} is declared as an outbox table, but the table of that name is not one (no outbox trigger): its "
        "enqueues, relay and status fail. Give the section another name in outbox.toml (db upgrade refuses to "
        "turn a table that exists into an outbox table)",
        ERROR,
    )


def _index_drift(conn: psycopg.Connection[Any], tables: list[str], migrations: list[Migration]) -> list[Drift]:
    """The indexes each table lacks of those ``outbox_create_table`` gives, as the applied migrations define it."""
    definitions = {d.suffix: d for d in table_indexes(defined_functions(migrations))}
    if not tables or not definitions:
        return []
    rows = _rows(conn, "schema_table_indexes", {"tables": tables, "suffixes": list(definitions)})
    found = []
    for row in rows:
        definition = definitions[row["suffix"]]
        if row["present"] or definition.optional:
            continue
        statement = definition.statement(row["index_name"], row["table_name"]).as_string(conn)
        found.append(
            Drift(
                "index",
                row["index_name"],
                f"index {row['index_name']} of outbox table {row['table_name']} is missing: the statements that use "
                f"it read the whole table instead, slower as it grows. Build it without stopping writes: {statement}",
                WARN,
            )
        )
    return found


def _function_drift(conn: psycopg.Connection[Any], migrations: list[Migration]) -> list[Drift]:
    """Each function the applied migrations define, against the database's (``find_drift`` skips this where the
    login may not read the checksums of the applied migrations: a producer's)."""
    checksums = {row["version"]: row["checksum"] for row in _rows(conn, "outbox_schema_migrations_applied")}
    expected: dict[str, FunctionDefinition | None] = {}
    for migration in migrations:
        same_text = checksums.get(migration.version) == migration.checksum
        expected.update({name: d if same_text else None for name, d in functions_of(migration).items()})
    comparable = {name: d for name, d in expected.items() if d is not None}
    actual: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in _rows(conn, "schema_functions", {"names": list(comparable)}):
        actual[row["name"]].append(row)
    found = []
    for name, definition in sorted(comparable.items()):
        restore = (
            f"Restore it: run the CREATE OR REPLACE FUNCTION {name} of {definition.migration} (the package's sql/)"
        )
        if not actual[name]:
            sentence = f"function {name} is missing (dropped by hand?): the statements that call it fail. {restore}"
        elif not any(
            row["body"] == definition.body and row["security_definer"] == definition.security_definer
            for row in actual[name]
        ):
            sentence = (
                f"function {name} differs from the one {definition.migration} defines (changed by hand?): the outbox "
                f"runs that change, not what this version was tested with. {restore}"
            )
        else:
            continue
        found.append(Drift("function", name, sentence, ERROR))
    return found


def _expected_rights(tables: list[str]) -> list[tuple[str, str, str, str | None]]:
    """(role, relation, privilege, column) of every right the package's roles should hold on ``tables`` and the
    shared tables."""
    rights: list[tuple[str, str, str, str | None]] = []
    for spec in roles.all_roles():
        rights.append((spec.name, SCHEMA, "USAGE", None))
        for grant in spec.grants:
            for relation in grant.tables_among(tables):
                rights += [(spec.name, relation, privilege, None) for privilege in grant.privileges]
                rights += [(spec.name, relation, on.privilege, column) for on in grant.columns for column in on.columns]
                if grant.id_sequence:
                    rights.append((spec.name, relation, SEQUENCE_USAGE, None))
    return rights


def _grant_drift(conn: psycopg.Connection[Any], tables: list[str]) -> list[Drift]:
    rights = _expected_rights(tables)
    params = {
        "roles": [r[0] for r in rights],
        "relations": [r[1] for r in rights],
        "privileges": [r[2] for r in rights],
        "columns": [r[3] for r in rights],
    }
    lacking: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in _rows(conn, "schema_missing_grants", params):
        what = (
            "USAGE on its id sequence"
            if row["privilege"] == SEQUENCE_USAGE
            else f"{row['privilege']} ({row['column_name']})"
            if row["column_name"]
            else row["privilege"]
        )
        lacking[(row["role"], row["relation"])].append(what)
    jobs = {spec.name: spec.job for spec in roles.all_roles()}
    found = []
    for (role, relation), what in sorted(lacking.items()):
        where = "the schema" if relation == SCHEMA else relation
        found.append(
            Drift(
                "grant",
                f"{role} on {where}",
                f"role {role} lacks {_joined(what)} on {where}: its logins ({jobs.get(role, 'its processes')}) fail "
                "with 'permission denied' there. Run 'outbox-pipelines db grant' as the owner of the outbox tables",
                ERROR,
            )
        )
    return found


def _joined(what: list[str]) -> str:
    """INSERT (a), INSERT (b), SELECT as 'INSERT (a, b), SELECT'."""
    columns: dict[str, list[str]] = defaultdict(list)
    for item in what:
        privilege, _, column = item.partition(" (")
        columns[privilege].append(column.rstrip(")"))
    return ", ".join(
        f"{privilege} ({', '.join(c for c in cols if c)})" if any(cols) else privilege
        for privilege, cols in columns.items()
    )
