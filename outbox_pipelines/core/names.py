"""Validation and quoting of table identifiers chosen by operators."""

import re

from psycopg import sql

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import InvalidTableName

TABLE_NAME_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

# The engine's tables of the outbox's own schema (sql/migrations and core/storage/migrate.py): never an
# outbox table, so never a name for one. With the wings' own (core/wings.py: shared_tables) this is the
# one list; a test checks it against the tables a migrated database really has.
RESERVED_TABLE_NAMES = frozenset(
    {
        "outbox_schema_migrations",  # core/storage/migrate.py: applied migrations
        "outbox_audit",  # 0001: every state change
        "outbox_relay_workers",  # 0004: relay heartbeats
        "outbox_destination_health",  # 0004: destination failures and circuit
        "outbox_alert_state",  # 0004: what each alert has told
        "outbox_table_owners",  # 0013: the project that declared each outbox table
        "outbox_schema_version",  # 0015: the applied versions, a view every login may read
    }
)
# PostgreSQL's catalogs: pg_catalog is searched before any schema, so "pg_class" would
# name the catalog, not a new table.
RESERVED_TABLE_PREFIXES = ("pg_",)


def reserved_table_names() -> frozenset[str]:
    """The schema's own tables: the engine's and the wings'."""
    return RESERVED_TABLE_NAMES | set(wings.shared_tables())


def reserved_reason(name: str) -> str | None:
    """Why ``name`` cannot be an outbox table, or None if it can."""
    reserved = reserved_table_names()
    if name in reserved:
        return f"it is one of the outbox's own tables ({', '.join(sorted(reserved))})"
    for prefix in RESERVED_TABLE_PREFIXES:
        if name.startswith(prefix):
            return f"names starting with {prefix!r} are PostgreSQL's system catalogs"
    return None


# Names already found valid: an enqueue checks its table's name once per message, inside the
# application's transaction (4 µs cold). Bounded, as names may come from input.
_VALID_NAMES: set[str] = set()


def validate_table_name(name: object) -> str:
    if type(name) is str and name in _VALID_NAMES:
        return name
    if not isinstance(name, str) or not TABLE_NAME_PATTERN.fullmatch(name):
        raise InvalidTableName(
            f"invalid outbox table name {name!r}: use 1-63 lowercase letters, digits "
            "and underscores, not starting with a digit (for example 'billing_outbox')"
        )
    reason = reserved_reason(name)
    if reason is not None:
        raise InvalidTableName(f"{name!r} cannot be an outbox table: {reason}; choose another name (e.g. 'hrm_outbox')")
    if len(_VALID_NAMES) < 1024:
        _VALID_NAMES.add(name)
    return name


def is_valid_table_name(name: object) -> bool:
    try:
        validate_table_name(name)
    except InvalidTableName:
        return False
    return True


def table_identifier(name: str) -> sql.Identifier:
    return sql.Identifier(validate_table_name(name))


def notify_channel(table_name: str) -> str:
    """The LISTEN/NOTIFY channel the insert trigger of ``table_name`` signals."""
    return "outbox:" + validate_table_name(table_name)
