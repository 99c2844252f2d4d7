"""Least-privilege group roles: what each part of the outbox may do in the database (``db grant``).

The engine's four NOLOGIN group roles, and those of the declared parts' wings (core/wings.py); an operator
puts each process's login role into one (``GRANT outbox_relay TO relay_login``). Their rights are declared
here, in ``ENGINE_ROLES`` (with what each wing adds: ``all_roles``), and applied by ``grant_roles``: the fixed
group roles are created when missing, then, in one transaction, every right they hold on the managed tables
(and on the outbox tables' id sequences) is revoked and the declared set granted, so a re-run converges on
the declaration instead of adding to it. A table made later is reached by running it again.

The rights follow the statements each part runs (sql/queries/*.sql), including
what PostgreSQL checks beneath them, and where a statement writes only some
columns the grant names only those (column privileges):

- A producer writes messages, never their delivery: INSERT on the columns an
  enqueue writes (``MESSAGE_COLUMNS``, and ``id``: enqueue_many's COPY writes the
  ids it reserved from the table's id sequence, on which it gets USAGE), so it
  cannot set ``status``, ``attempts``, ``published_at``, ``locked_by``,
  ``result_ref`` and the rest, and it cannot UPDATE or DELETE a row. Writing
  ``id`` lets a producer pick a new row's id (as COPY does, and as its INSERT on
  the whole table allowed before): that moves the row in the claim order, and an
  id the sequence hands out later then fails that later insert (a unique
  violation), so a producer login can disturb other producers' enqueues.
- ``INSERT ... ON CONFLICT (event_id) ... RETURNING id`` needs SELECT on
  ``event_id`` and ``id``; ``Outbox.enqueue``'s duplicate path reads ``id``,
  ``event_id`` and ``payload_sha``. The producer gets SELECT on those three
  columns only: it can tell a duplicate but cannot read a message.
- The producer has no right at all on an outbox table a wing writes itself
  (``Wing.producer_excluded_tables``): the wing's own role inserts there.
- The relay (and the maintainer, which relays too) UPDATEs only the delivery
  columns (``DELIVERY_COLUMNS``): never a message's payload, digest, topic, event
  id, headers, tenant or creation time. Column privileges cannot say which
  *values* a column may take: a relay login can still set a dead row's
  ``status`` back to ``pending`` (a replay) or mark a row ``sent``. Keeping a
  relay from that needs a row-level rule (a trigger or a policy), which these
  grants are not.
- A wing's shared tables get the rights its ``engine_role_grants`` declare for each engine role, no more.
- The relay's settle statement carries its DELETE branch (tables that delete on
  success) whatever the table's setting, so the relay holds DELETE on the outbox
  tables; cleaning sent rows adds no right on them, only on the shared tables.
  PostgreSQL checks SELECT on every column an UPDATE reads (SET expressions,
  WHERE, RETURNING) and UPDATE on a column for ``FOR UPDATE``: the relay reads
  the whole row anyway, so it keeps SELECT on the outbox tables.
- Identity columns written by INSERT, the NOTIFY trigger, ``pg_notify``, LISTEN
  and advisory locks need no grant (the functions are PUBLIC); only ``nextval``
  called by name (the COPY's id reservation) needs USAGE on the sequence.

The statements are roles.sql's, composed with psycopg.sql identifiers (role names constant, table names validated).
"""

from collections.abc import Iterable, Mapping, Sequence
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
from outbox_pipelines.core.storage.table import SharedTables

PRODUCER = "outbox_producer"
RELAY = "outbox_relay"
MAINTAINER = "outbox_maintainer"
READER = "outbox_reader"

# Stands for every outbox table of the schema (those carrying the notify trigger) in a Grant.
EVERY_OUTBOX_TABLE = "*"
# What an enqueue writes of a message (sql/queries/outbox.sql, outbox_insert and outbox_insert_many).
MESSAGE_COLUMNS = ("event_id", "tenant_id", "topic", "payload", "payload_sha", "headers", "available_at")
# What an application's enqueue writes: the message, the id that enqueue_many's COPY reserved, and an
# ordering key with whether it waits behind an earlier message of its key (migration 0010).
ENQUEUE_COLUMNS = ("id", *MESSAGE_COLUMNS, "ordering_key", "ordering_blocked")
# What Outbox.enqueue reads back: the new id, a duplicate's id and payload digest, and whether an
# earlier message still holds the ordering key (outbox_insert_keyed reads the key's holders).
ENQUEUE_READ_COLUMNS = ("id", "event_id", "payload_sha", "ordering_key", "ordering_skipped_at", "status")
# What claims, settles, lease renewals, requeues and replays write (outbox.sql): how delivery went.
DELIVERY_COLUMNS = (
    "status",
    "attempts",
    "available_at",
    "locked_by",
    "locked_at",
    "lease_expires_at",
    "last_error",
    "last_error_code",
    "result_ref",
    "published_at",
    "updated_at",
    "ordering_blocked",
    "ordering_skipped_at",
)
PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})
# The privileges PostgreSQL can grant on some columns only (DELETE takes whole rows).
COLUMN_PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE"})


class GrantRefused(OutboxError):
    """This session may not grant on the outbox's schema or tables: it does not own them."""


@dataclass(frozen=True)
class OnColumns:
    """One privilege on some columns of a table only (``GRANT INSERT (a, b) ON t``)."""

    privilege: str
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.privilege not in COLUMN_PRIVILEGES:
            raise ValueError(f"{self.privilege} cannot be granted on columns (one of {sorted(COLUMN_PRIVILEGES)})")
        if not self.columns:
            raise ValueError(f"{self.privilege} on no columns")


@dataclass(frozen=True)
class Grant:
    """Rights on one table (a shared table's name, or EVERY_OUTBOX_TABLE).

    ``privileges``: on the whole table. ``columns``: privileges on some columns only, each privilege
    at most once and never also on the whole table. ``id_sequence``: USAGE on the table's id sequence.
    ``except_tables``: with EVERY_OUTBOX_TABLE, the outbox tables this grant leaves out.
    """

    table: str
    privileges: tuple[str, ...] = ()
    columns: tuple[OnColumns, ...] = ()
    id_sequence: bool = False
    except_tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.privileges) - PRIVILEGES
        if unknown:
            raise ValueError(f"unknown privileges {sorted(unknown)}")
        on_columns = [c.privilege for c in self.columns]
        twice = {p for p in on_columns if on_columns.count(p) > 1} | (set(on_columns) & set(self.privileges))
        if twice:
            raise ValueError(f"{sorted(twice)} granted twice on {self.table}: once on the table or its columns")
        if self.except_tables and self.table != EVERY_OUTBOX_TABLE:
            raise ValueError("except_tables only narrows EVERY_OUTBOX_TABLE")

    def tables_among(self, outbox_tables: Sequence[str]) -> list[str]:
        """The tables this grant is on, given the database's outbox tables."""
        if self.table != EVERY_OUTBOX_TABLE:
            return [self.table]
        return [name for name in outbox_tables if name not in self.except_tables]

    def columns_of(self, privilege: str) -> tuple[str, ...] | None:
        """The columns ``privilege`` is granted on; None: the whole table; () not granted."""
        if privilege in self.privileges:
            return None
        return next((c.columns for c in self.columns if c.privilege == privilege), ())


@dataclass(frozen=True)
class RoleSpec:
    name: str
    job: str  # who runs under it, one line for the CLI and the docs
    grants: tuple[Grant, ...]


_READ_AND_WRITE = ("SELECT", "INSERT", "UPDATE")
# The relay's shared tables: its audit rows, its heartbeat, the destination's health (a wing adds what
# the relay writes in its tables: an application's own handler tables are the application's to grant).
_RELAY_SHARED = (
    Grant("outbox_audit", ("INSERT",)),
    Grant("outbox_relay_workers", _READ_AND_WRITE),
    Grant("outbox_destination_health", _READ_AND_WRITE),
    Grant("outbox_table_owners", ("SELECT",)),  # it leaves alone a table another project owns
    Grant("outbox_schema_migrations", ("SELECT",)),  # it checks the schema is the one its code needs
)
# Reads whole rows (it delivers them), deletes them (on_success = "delete"), writes only how delivery went.
_RELAY_OUTBOX = Grant(EVERY_OUTBOX_TABLE, ("SELECT", "DELETE"), (OnColumns("UPDATE", DELIVERY_COLUMNS),))

ENGINE_ROLES: tuple[RoleSpec, ...] = (
    RoleSpec(
        PRODUCER,
        "applications that enqueue (Outbox.enqueue in their own transaction)",
        (
            Grant(
                EVERY_OUTBOX_TABLE,
                columns=(OnColumns("INSERT", ENQUEUE_COLUMNS), OnColumns("SELECT", ENQUEUE_READ_COLUMNS)),
                id_sequence=True,
            ),
        ),
    ),
    RoleSpec(RELAY, "standalone relays (outbox-pipelines relay)", (_RELAY_OUTBOX, *_RELAY_SHARED)),
    RoleSpec(
        MAINTAINER,
        "the Dagster code location, and the CLI's relay, requeue-stuck, clean and replay",
        (
            _RELAY_OUTBOX,  # replay and requeue-stuck write the delivery columns too
            Grant("outbox_audit", ("SELECT", "INSERT", "DELETE")),
            Grant("outbox_relay_workers", _READ_AND_WRITE),
            Grant("outbox_destination_health", _READ_AND_WRITE),
            Grant("outbox_alert_state", _READ_AND_WRITE),
            Grant("outbox_schema_migrations", ("SELECT",)),
            Grant("outbox_table_owners", ("SELECT",)),
        ),
    ),
    RoleSpec(
        READER,
        "outbox-pipelines status, dashboards and metrics scrapers (read only)",
        (
            Grant(EVERY_OUTBOX_TABLE, ("SELECT",)),
            *(
                Grant(name, ("SELECT",))
                for name in (
                    "outbox_audit",
                    "outbox_relay_workers",
                    "outbox_destination_health",
                    "outbox_alert_state",
                    "outbox_schema_migrations",
                    "outbox_table_owners",
                )
            ),
        ),
    ),
)


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
        table = table_identifier(table_name) if grant.table == EVERY_OUTBOX_TABLE else sql.Identifier(table_name)
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
    specs = all_roles()
    shared = sorted(
        {g.table for spec in specs for g in spec.grants if g.table != EVERY_OUTBOX_TABLE} - set(outbox_tables)
    )
    present = [name for name in shared if _fetch_one(conn, "role_table_exists", {"table_name": name})["found"]]
    schema = _check_grantable(conn, [*outbox_tables, *present])
    names = [spec.name for spec in specs]
    missing = [role for role in names if not _fetch_one(conn, "role_exists", {"role": role})["found"]]
    plan = GrantPlan(schema, outbox_tables, missing)
    plan.absent_tables = [name for name in shared if name not in present]
    sequences = {name: _id_sequence(conn, name) for name in outbox_tables}
    roles = sql.SQL(", ").join(sql.Identifier(role) for role in names)
    plan.statements.append(_composed("role_schema_usage", schema=sql.Identifier(schema), roles=roles))
    for table_name in [*outbox_tables, *present]:
        plan.statements.append(_composed("role_table_revoke", table=sql.Identifier(table_name), roles=roles))
    for sequence in sequences.values():
        if sequence is not None:
            plan.statements.append(_composed("role_sequence_revoke", sequence=sequence, roles=roles))
    for spec in specs:
        for grant in spec.grants:
            tables = [t for t in grant.tables_among(outbox_tables) if t in outbox_tables or t in present]
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
        where = "every outbox table" if grant.table == EVERY_OUTBOX_TABLE else grant.table
        if grant.except_tables:
            where += f" except {', '.join(grant.except_tables)}"
        granted = [*grant.privileges, *(f"{on.privilege} ({', '.join(on.columns)})" for on in grant.columns)]
        lines.append(f"{', '.join(granted)} on {where}")
        if grant.id_sequence:
            lines.append(f"USAGE on the id sequence of {where}")
    return lines
