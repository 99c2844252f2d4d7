"""What each of the engine's group roles may do in the database: the rights ``db grant`` applies (``roles``).

The rights follow the statements each part runs (sql/queries/*.sql), including what PostgreSQL checks
beneath them, and where a statement writes only some columns the grant names only those (column
privileges). What no grant can say (which values a column may take, who wrote a row) the database's
triggers hold (migrations 0017 and 0018; docs/explanation/security.md):

- A producer writes messages, never their delivery nor their place: INSERT on the columns an enqueue
  writes (``ENQUEUE_COLUMNS``: the message and its ordering key), so it cannot set ``id`` (an identity
  column is overridden only by a role that may write it: a chosen low id jumped a parked key),
  ``status``, ``attempts``, ``ordering_blocked`` (the insert trigger says whether the message waits),
  ``published_at`` and the rest, and it cannot UPDATE or DELETE a row. Without ``id``, enqueue_many's COPY
  (which writes the ids it reserved) is not the producer's: its batches go by INSERT.
- ``INSERT ... ON CONFLICT (event_id) ... RETURNING id`` needs SELECT on ``event_id`` and ``id``;
  ``Outbox.enqueue``'s duplicate path reads ``id``, ``event_id`` and ``payload_sha``. The producer gets
  SELECT on those three columns only: it can tell a duplicate, but it reads no message, no ordering key
  and no state.
- The producer has no right at all on an outbox table a wing writes itself
  (``Wing.producer_excluded_tables``): the wing's own role inserts there.
- The relay (and the maintainer, which relays too) UPDATEs only the delivery columns
  (``DELIVERY_COLUMNS``): never a message's payload, digest, topic, event id, headers, tenant or creation
  time. Column privileges cannot say which *values* a column may take: a relay login can still mark a
  row ``sent`` or send a dead one back to ``pending``; the database audits every such change that the
  statement making it did not audit, with the login that made it (migration 0018).
- Audit rows are written, never changed: INSERT on ``AUDIT_COLUMNS`` only, so the row's ``login``,
  ``xact`` and ``created_at`` are the database's (their defaults); an audit row naming another login's
  relay worker is refused (migration 0017). The maintainer deletes old ones (the audit's retention).
- A wing's shared tables get the rights its ``engine_role_grants`` declare for each engine role, no more.
- The relay's settle statement carries its DELETE branch (tables that delete on success) whatever the
  table's setting, so the relay holds DELETE on the outbox tables; cleaning sent rows adds no right on
  them, only on the shared tables. PostgreSQL checks SELECT on every column an UPDATE reads (SET
  expressions, WHERE, RETURNING) and UPDATE on a column for ``FOR UPDATE``: the relay reads the whole row
  anyway, so it keeps SELECT on the outbox tables.
- The NOTIFY trigger, ``pg_notify``, LISTEN and advisory locks need no grant (the functions are PUBLIC).
"""

from collections.abc import Sequence
from dataclasses import dataclass

PRODUCER = "outbox_producer"
RELAY = "outbox_relay"
MAINTAINER = "outbox_maintainer"
READER = "outbox_reader"

# Stands for every outbox table of the schema (those carrying the notify trigger) in a Grant.
EVERY_OUTBOX_TABLE = "*"
# What an enqueue writes of a message (sql/queries/outbox.sql, outbox_insert and outbox_insert_many).
MESSAGE_COLUMNS = ("event_id", "tenant_id", "topic", "payload", "payload_sha", "headers", "available_at")
# What an application's enqueue writes: the message and its ordering key (migration 0010; whether it waits
# behind an earlier message of its key is the insert trigger's to say, migration 0018).
ENQUEUE_COLUMNS = (*MESSAGE_COLUMNS, "ordering_key")
# What Outbox.enqueue reads back: the new id, a duplicate's id and payload digest.
ENQUEUE_READ_COLUMNS = ("id", "event_id", "payload_sha")
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
# What the engine's statements write of an audit row; its id, login, transaction and time are the database's.
AUDIT_COLUMNS = (
    "outbox_table",
    "message_id",
    "event_id",
    "tenant_id",
    "from_status",
    "to_status",
    "attempts",
    "code",
    "error_code",
    "worker",
    "trace_id",
    "detail",
    "claimed_at",
)
PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})
# The privileges PostgreSQL can grant on some columns only (DELETE takes whole rows).
COLUMN_PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE"})


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
_WRITE_AUDIT = (OnColumns("INSERT", AUDIT_COLUMNS),)
# The relay's shared tables: its audit rows, its heartbeat, the destination's health (a wing adds what
# the relay writes in its tables: an application's own handler tables are the application's to grant).
_RELAY_SHARED = (
    Grant("outbox_audit", columns=_WRITE_AUDIT),
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
            ),
        ),
    ),
    RoleSpec(RELAY, "standalone relays (outbox-pipelines relay)", (_RELAY_OUTBOX, *_RELAY_SHARED)),
    RoleSpec(
        MAINTAINER,
        "the Dagster code location, and the CLI's relay, requeue-stuck, clean and replay",
        (
            _RELAY_OUTBOX,  # replay and requeue-stuck write the delivery columns too
            Grant("outbox_audit", ("SELECT", "DELETE"), _WRITE_AUDIT),
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
