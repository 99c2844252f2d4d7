"""What each of the engine's group roles may do in the database: the rights ``db grant`` applies (``roles``).

The rights follow the statements each part runs (sql/queries/*.sql), column by column where a statement writes
only some columns; what no grant can say (values, who wrote a row) the database's triggers hold.
Role by role, and why: docs/explanation/storage.md, "The roles' rights".
"""

from collections.abc import Sequence
from dataclasses import dataclass

PRODUCER = "outbox_producer"
RELAY = "outbox_relay"
MAINTAINER = "outbox_maintainer"
READER = "outbox_reader"

# Stands for every outbox table of the schema (those carrying the notify trigger) in a Grant.
EVERY_OUTBOX_TABLE = "*"
# Stands for every inbox table of the schema (migration 0022's; core/inbox/): a consumer's record of what it handled.
EVERY_INBOX_TABLE = "inbox:*"
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

    def tables_among(self, outbox_tables: Sequence[str], inbox_tables: Sequence[str] = ()) -> list[str]:
        """The tables this grant is on, given the database's outbox tables (and inbox tables)."""
        if self.table == EVERY_INBOX_TABLE:
            return list(inbox_tables)
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
            # Inbox.receive: INSERT ... ON CONFLICT DO NOTHING reads the key it conflicts on.
            Grant(EVERY_INBOX_TABLE, ("SELECT", "INSERT")),
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
            Grant(EVERY_INBOX_TABLE, ("SELECT", "DELETE")),  # the cleaner: entries past the inbox's window
        ),
    ),
    RoleSpec(
        READER,
        "outbox-pipelines status, dashboards and metrics scrapers (read only)",
        (
            Grant(EVERY_OUTBOX_TABLE, ("SELECT",)),
            Grant(EVERY_INBOX_TABLE, ("SELECT",)),
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
