"""Per-table autovacuum settings for the outbox tables and the audit, which ``db upgrade`` applies.

An outbox table churns (every message inserted, updated twice, deleted): it is vacuumed far more often than
PostgreSQL's defaults would. ``OUTBOX_AUTOVACUUM`` overrides. The figures and what other queues chose:
docs/explanation/storage.md, "Autovacuum".
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.names import table_identifier
from outbox_pipelines.core.storage.connections import connect
from outbox_pipelines.core.storage.queries import shared_query

AUDIT = "outbox_audit"
ENV = "OUTBOX_AUTOVACUUM"
OUTBOX_TABLE_DEFAULTS: dict[str, str] = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_limit": "2000",
}
AUDIT_DEFAULTS: dict[str, str] = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "10000",
    "autovacuum_vacuum_cost_limit": "2000",
}
# The storage parameters an override may name (PostgreSQL's own names, without the toast. ones).
ALLOWED = frozenset(
    {
        "autovacuum_enabled",
        "autovacuum_vacuum_threshold",
        "autovacuum_vacuum_max_threshold",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_insert_threshold",
        "autovacuum_vacuum_insert_scale_factor",
        "autovacuum_analyze_threshold",
        "autovacuum_analyze_scale_factor",
        "autovacuum_vacuum_cost_delay",
        "autovacuum_vacuum_cost_limit",
        "autovacuum_freeze_min_age",
        "autovacuum_freeze_max_age",
        "autovacuum_freeze_table_age",
        "log_autovacuum_min_duration",
        "fillfactor",
        "vacuum_truncate",
    }
)
_VALUE = re.compile(r"^(-?\d+(\.\d+)?|on|off|true|false)$")
LOCK_TIMEOUT_S = 5.0


def parse(setting: str) -> dict[str, str] | None:
    """``OUTBOX_AUTOVACUUM`` read: None for ``off``, else the overrides (empty for ``default``); ConfigError
    naming the variable and what to write."""
    text = setting.strip()
    if text.lower() in ("", "default"):
        return {}
    if text.lower() == "off":
        return None
    overrides: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = (part.strip().lower() for part in item.partition("="))
        if not sep or name not in ALLOWED or not _VALUE.match(value):
            raise ConfigError(
                f"{ENV}={setting!r}: {item.strip()!r} is not name=value with a number or on/off, for one of "
                f"{', '.join(sorted(ALLOWED))}; or write default or off"
            )
        overrides[name] = value
    return overrides


def wanted(table: str, overrides: dict[str, str]) -> dict[str, str]:
    """The settings ``table`` should carry: the audit's or an outbox table's defaults, the overrides over them."""
    return {**(AUDIT_DEFAULTS if table == AUDIT else OUTBOX_TABLE_DEFAULTS), **overrides}


@dataclass
class AutovacuumReport:
    """What ``apply`` did: settings given per table, tables already set, tables left (and why)."""

    applied: dict[str, dict[str, str]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def current(conn: psycopg.Connection[Any], tables: Iterable[str]) -> dict[str, dict[str, str]]:
    """The storage parameters each existing table of ``tables`` carries now (reloptions)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("table_storage_options"), {"tables": list(tables)})
        rows = cur.fetchall()
    return {row["table_name"]: dict(option.split("=", 1) for option in row["options"]) for row in rows}


def changes(
    conn: psycopg.Connection[Any], tables: Iterable[str], setting: str, *, absent: bool = False
) -> dict[str, dict[str, str]]:
    """Per existing table of ``tables``, the settings to give it (none: already so, or ``off``); ``absent``: a table
    not in the database yet (the same upgrade creates it) gets all of them."""
    overrides, tables = parse(setting), list(tables)
    if overrides is None:
        return {}
    found = current(conn, tables)
    return {
        table: diff
        for table in tables
        if (table in found or absent)
        and (diff := {k: v for k, v in wanted(table, overrides).items() if found.get(table, {}).get(k) != v})
    }


def statement(table: str, options: dict[str, str]) -> sql.Composed:
    """``ALTER TABLE <table> SET (name = 'value', ...)``: the table's name validated and quoted, the option names
    from ALLOWED, the values literals."""
    assert set(options) <= ALLOWED, options
    pairs = sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.SQL(k), sql.Literal(v)) for k, v in options.items())
    name = sql.Identifier(AUDIT) if table == AUDIT else table_identifier(table)
    return sql.SQL("ALTER TABLE {} SET ({})").format(name, pairs)


def plan_sql(url: str, tables: Iterable[str], setting: str) -> list[str]:
    """The statements ``apply`` would run now, as text (``db upgrade --dry-run``); nothing is changed."""
    with connect(url) as conn:
        todo = changes(conn, tables, setting, absent=True)
        return [statement(table, options).as_string(conn) + ";" for table, options in todo.items()]


def apply(url: str, tables: Iterable[str], setting: str) -> AutovacuumReport:
    """Give each existing table of ``tables`` its settings, one short transaction a table. A table this login
    does not own, or whose lock a VACUUM or DDL held past LOCK_TIMEOUT_S, is skipped (said in ``skipped``)."""
    report = AutovacuumReport()
    tables = list(tables)
    with connect(url) as conn:
        todo = changes(conn, tables, setting)
        report.unchanged = [table for table in tables if table not in todo]
        for table, options in todo.items():
            try:
                with conn.transaction():
                    conn.execute(shared_query("storage_options_lock_timeout"), {"ms": f"{LOCK_TIMEOUT_S * 1000:.0f}ms"})
                    conn.execute(statement(table, options))
            except psycopg.errors.InsufficientPrivilege:
                report.skipped[table] = "this login does not own it (the schema owner's db upgrade sets it)"
            except psycopg.errors.LockNotAvailable:
                report.skipped[table] = (
                    f"a VACUUM or DDL held it past {LOCK_TIMEOUT_S:g} s; the next db upgrade sets it"
                )
            else:
                report.applied[table] = options
    return report
