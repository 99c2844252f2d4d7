"""Validation and quoting of table identifiers chosen by operators."""

import re

from psycopg import sql

from outbox_pipelines.core.errors import InvalidTableName

TABLE_NAME_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def validate_table_name(name: object) -> str:
    if not isinstance(name, str) or not TABLE_NAME_PATTERN.fullmatch(name):
        raise InvalidTableName(
            f"invalid outbox table name {name!r}: use 1-63 lowercase letters, digits "
            "and underscores, not starting with a digit (for example 'outbox_orders')"
        )
    return name


def table_identifier(name: str) -> sql.Identifier:
    return sql.Identifier(validate_table_name(name))


def notify_channel(table: str) -> str:
    """The LISTEN/NOTIFY channel the insert trigger of ``table`` signals."""
    return "outbox:" + validate_table_name(table)
