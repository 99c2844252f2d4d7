"""Least-privilege group roles: what each part of the outbox may do in the database (``db grant``).

The engine's four NOLOGIN group roles and the wings'; rights declared in ``role_grants``, applied by
``grant_roles``: revoke, then grant the declared set, in one transaction, so a re-run converges.
Why each right: docs/explanation/storage.md, "The roles' rights".
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import OutboxError
from outbox_pipelines.core.names import table_identifier, validate_table_name
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.queries import shared_query
from outbox_pipelines.core.storage.role_grants import (
    AUDIT_COLUMNS,
    DELIVERY_COLUMNS,
    ENGINE_ROLES,
    ENQUEUE_COLUMNS,
    ENQUEUE_READ_COLUMNS,
    EVERY_INBOX_TABLE,
    EVERY_OUTBOX_TABLE,
    MAINTAINER,
    MESSAGE_COLUMNS,
    PRODUCER,
    READER,
    RELAY,
    Grant,
    OnColumns,
    RoleSpec,
)
from outbox_pipelines.core.storage.table import SharedTables

# The declarations are role_grants's; their names are imported from here too (wings, the CLI, the tests).
__all__ = [
    "AUDIT_COLUMNS",
    "DELIVERY_COLUMNS",
    "ENGINE_ROLES",
    "ENQUEUE_COLUMNS",
    "ENQUEUE_READ_COLUMNS",
    "EVERY_INBOX_TABLE",
    "EVERY_OUTBOX_TABLE",
    "MAINTAINER",
    "MESSAGE_COLUMNS",
    "PRODUCER",
    "READER",
    "RELAY",
    "Grant",
    "OnColumns",
    "RoleSpec",
    "GrantPlan",
    "GrantRefused",
    "all_roles",
    "apply_plan",
    "grant_roles",
    "plan_grants",
    "rights",
    "role_names",
]


class GrantRefused(OutboxError):
    """This session may not grant on the outbox's schema or tables: it does not own them."""


def all_roles() -> tuple[RoleSpec, ...]:
    """The engine's roles with what the wings add to them (their tables' rights, the producer kept off the
    tables they write themselves), then the wings' own roles."""
    excluded = wings.producer_excluded_tables()
    specs = []
    for spec in ENGINE_ROLES:
        grants = tuple(
            replace(g, except_tables=(*g.except_tables, *excluded))
            if spec.name == PRODUCER and g.table == EVERY_OUTBOX_TABLE and excluded
            else g
            for g in spec.grants
        )
        specs.append(replace(spec, grants=grants + wings.engine_role_grants(spec.name)))
    return (*specs, *wings.roles())


def role_names() -> tuple[str, ...]:
    return tuple(spec.name for spec in all_roles())


@dataclass
class GrantPlan:
    """What ``db grant`` does on one database: the roles to create, then one transaction of statements."""

    schema: str
    outbox_tables: list[str]
    missing_roles: list[str]
    statements: list[sql.Composed] = field(default_factory=list)
    absent_tables: list[str] = field(default_factory=list)  # shared tables this database does not have
    inbox_tables: list[str] = field(default_factory=list)  # the inbox tables (migration 0022) it has

    def sql_text(self, conn: psycopg.Connection) -> list[str]:
        """Every statement as SQL text, as psql could run it: role creation, then the transaction (--dry-run)."""
        creates = [_composed("role_create", role=sql.Identifier(role)) for role in self.missing_roles]
        text = [_without_comments(statement.as_string(conn)) + ";" for statement in self.statements]
        return [_without_comments(c.as_string(conn)) + ";" for c in creates] + ["BEGIN;", *text, "COMMIT;"]


def _without_comments(text: str) -> str:
    """The statement without roles.sql's comment lines (they explain the file, not each statement printed)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


def _composed(query: str, **parts: sql.Composable) -> sql.Composed:
    return shared_query(query).format(**parts)


def _fetch_one(conn: psycopg.Connection, query: str, params: dict[str, object]) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(query), params)
        row = cur.fetchone()
    assert row is not None  # each of these statements returns one row
    return row


def _id_sequence(conn: psycopg.Connection, table_name: str) -> sql.Identifier | None:
    """The identity sequence behind an outbox table's id, schema-qualified (None: the table has none)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("role_id_sequence"), {"table_name": table_name})
        row = cur.fetchone()
    return sql.Identifier(row["schema_name"], row["sequence_name"]) if row else None


def _grant_statements(
    spec: RoleSpec, grant: Grant, tables: Iterable[str], sequences: Mapping[str, sql.Identifier | None]
) -> list[sql.Composed]:
    role = sql.Identifier(spec.name)
    statements = []
    for table_name in tables:
        every = (EVERY_OUTBOX_TABLE, EVERY_INBOX_TABLE)
        table = table_identifier(table_name) if grant.table in every else sql.Identifier(table_name)
        if grant.privileges:
            privileges = sql.SQL(", ").join(sql.SQL(p) for p in grant.privileges)  # keywords from PRIVILEGES
            statements.append(_composed("role_table_grant", privileges=privileges, table=table, role=role))
        for on in grant.columns:
            columns = sql.SQL(", ").join(sql.Identifier(c) for c in on.columns)
            statements.append(
                _composed(
                    "role_columns_grant",
                    privilege=sql.SQL(on.privilege),  # COLUMN_PRIVILEGES
                    columns=columns,
                    table=table,
                    role=role,
                )
            )
        sequence = sequences.get(table_name)
        if grant.id_sequence and sequence is not None:
            statements.append(_composed("role_sequence_grant", sequence=sequence, role=role))
    return statements


def _check_grantable(conn: psycopg.Connection, tables: list[str]) -> str:
    """The current schema's name, once this session may grant on it and on ``tables`` (GrantRefused if not)."""
    found = _fetch_one(conn, "role_grantable", {"tables": tables})
    not_owned: list[str] = found["not_owned"]
    if tables and not found["owns_schema"] and not not_owned:  # PostgreSQL 14: its owner does not own schema public
        schema, me = (sql.Identifier(found[k]).as_string(conn) for k in ("schema_name", "me"))
        raise GrantRefused(
            f"this role owns the outbox tables but not schema {found['schema_name']}, and only an owner can grant on "
            f"it (on PostgreSQL 14 a database's owner does not own its schema public): a superuser runs once, in this "
            f"database, ALTER SCHEMA {schema} OWNER TO {me}; then run 'outbox-pipelines db grant' again"
        )
    if not found["owns_schema"] or not_owned:
        what = ([f"schema {found['schema_name']}"] if not found["owns_schema"] else []) + not_owned
        raise GrantRefused(
            f"this role does not own {', '.join(what)}, and only an owner can grant on them: run "
            "'outbox-pipelines db grant' as the role that ran 'db upgrade' (with CREATEROLE), or as a superuser"
        )
    return str(found["schema_name"])


def plan_grants(conn: psycopg.Connection) -> GrantPlan:
    """The statements that bring the roles to their declared rights on this database; changes nothing.

    GrantRefused when this session does not own the schema and the tables (a GRANT by anyone
    else only warns, and would change nothing).
    """
    outbox_tables = [validate_table_name(name) for name in SharedTables(conn).outbox_table_names()]
    with conn.cursor(row_factory=dict_row) as cur:
        inbox_tables = [
            validate_table_name(row["table_name"]) for row in cur.execute(shared_query("inbox_tables_list"))
        ]
    specs = all_roles()
    every = (EVERY_OUTBOX_TABLE, EVERY_INBOX_TABLE)
    shared = sorted({g.table for spec in specs for g in spec.grants if g.table not in every} - set(outbox_tables))
    present = [name for name in shared if _fetch_one(conn, "role_table_exists", {"table_name": name})["found"]]
    schema = _check_grantable(conn, [*outbox_tables, *inbox_tables, *present])
    names = [spec.name for spec in specs]
    missing = [role for role in names if not _fetch_one(conn, "role_exists", {"role": role})["found"]]
    plan = GrantPlan(schema, outbox_tables, missing, inbox_tables=inbox_tables)
    plan.absent_tables = [name for name in shared if name not in present]
    sequences = {name: _id_sequence(conn, name) for name in outbox_tables}
    roles = sql.SQL(", ").join(sql.Identifier(role) for role in names)
    plan.statements.append(_composed("role_schema_usage", schema=sql.Identifier(schema), roles=roles))
    for table_name in [*outbox_tables, *inbox_tables, *present]:
        plan.statements.append(_composed("role_table_revoke", table=sql.Identifier(table_name), roles=roles))
    for sequence in sequences.values():
        if sequence is not None:
            plan.statements.append(_composed("role_sequence_revoke", sequence=sequence, roles=roles))
    for spec in specs:
        for grant in spec.grants:
            tables = [
                t
                for t in grant.tables_among(outbox_tables, inbox_tables)
                if t in outbox_tables or t in inbox_tables or t in present
            ]
            plan.statements += _grant_statements(spec, grant, tables, sequences)
    return plan


def _create_role(conn: psycopg.Connection, role: str) -> None:
    """CREATE ROLE in a transaction of its own (``conn`` is in autocommit), tolerating another session
    that created it meanwhile: roles are cluster-wide, and several databases may be granted at once."""
    try:
        conn.execute(_composed("role_create", role=sql.Identifier(role)))
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        pass


def apply_plan(conn: psycopg.Connection, plan: GrantPlan) -> None:
    """Create the missing roles (each on its own), then revoke and grant in one transaction."""
    for role in plan.missing_roles:
        _create_role(conn, role)
    with conn.transaction():
        for statement in plan.statements:
            conn.execute(statement)


def grant_roles(url: str, *, dry_run: bool = False) -> tuple[GrantPlan, list[str]]:
    """Create and grant the group roles on the database at ``url`` (as the tables' owner with
    CREATEROLE, or a superuser); the plan, and its SQL text. ``dry_run`` changes nothing."""
    with connect(url) as conn:
        plan = plan_grants(conn)
        text = plan.sql_text(conn)
        if not dry_run:
            apply_plan(conn, plan)
    return plan, text


def rights(spec: RoleSpec) -> list[str]:
    """The role's rights, one line a grant (two with its id sequences), e.g.
    'SELECT, DELETE, UPDATE (status, attempts, ...) on every outbox table'."""
    lines = []
    for grant in spec.grants:
        names = {EVERY_OUTBOX_TABLE: "every outbox table", EVERY_INBOX_TABLE: "every inbox table"}
        where = names.get(grant.table, grant.table)
        if grant.except_tables:
            where += f" except {', '.join(grant.except_tables)}"
        granted = [*grant.privileges, *(f"{on.privilege} ({', '.join(on.columns)})" for on in grant.columns)]
        lines.append(f"{', '.join(granted)} on {where}")
        if grant.id_sequence:
            lines.append(f"USAGE on the id sequence of {where}")
    return lines
