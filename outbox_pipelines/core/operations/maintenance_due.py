"""Whether a maintenance pass has anything to do, asked before a run is launched for it.

The schedules ask first (one cheap statement per table, sql/queries/maintenance_due.sql, mirroring the pass) and
launch a run only for tables with work, so an idle deployment's Runs page is not a list of no-ops. Each answer
maps table -> why; empty: nothing to do.
"""

from collections.abc import Sequence
from datetime import datetime

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.inbox.cleaner import inboxes_due
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.settings.inboxes import InboxSettings
from outbox_pipelines.core.storage.queries import shared_query, table_query
from outbox_pipelines.core.storage.shared_tables import SharedTables

AUDIT = "outbox_audit"
AUDIT_BATCH = 5000  # the audit cleaner's batch (core/operations/maintenance.py), which its due check reads past


def _table_row(conn: psycopg.Connection, query: str, table_name: str, params: dict[str, object]) -> dict[str, object]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(table_query(query, validate_table_name(table_name)), params)
        row = cur.fetchone()
    assert row is not None  # a SELECT of aggregates and EXISTS always returns its row
    return row


def audit_kept(conn: psycopg.Connection) -> list[int]:
    """The ids of the audit rows no retention deletes, in order: those of the messages still dead, in every
    outbox table of the schema (docs/how-to/retention.md)."""
    ids: list[int] = []
    for name in SharedTables(conn).outbox_table_names():
        found = _table_row(conn, "outbox_audit_ids_of_dead", name, {"table_name": name})["ids"]
        assert isinstance(found, list)
        ids += found
    return sorted(ids)


def requeue_due(
    conn: psycopg.Connection, tables: Sequence[TableSettings], *, now: datetime | None = None
) -> dict[str, str]:
    """The tables ``requeue_stuck`` (core/operations/maintenance.py) would change, and why."""
    due: dict[str, str] = {}
    for table in tables:
        row = _table_row(
            conn,
            "maintenance_requeue_due",
            table.name,
            {"now": now, "stuck_after_s": table.stuck_threshold_s, "pass_over_dead": table.ordering == "skip"},
        )
        why = []
        if row["stuck"]:
            stuck = int(str(row["stuck"]))
            why.append(f"{'1000+' if stuck >= 1000 else stuck} rows stuck in sending")
        if row["dead_heads"]:
            why.append("dead heads to pass over (ordering = skip)")
        if row["orphaned_keys"]:
            why.append("an ordering key waits with nothing before it")
        if why:
            due[table.name] = ", ".join(why)
    return due


def clean_due(
    conn: psycopg.Connection,
    tables: Sequence[TableSettings],
    *,
    dead_retention_s: float,
    audit_retention_s: float,
    now: datetime | None = None,
    inboxes: Sequence[InboxSettings] = (),
) -> dict[str, str]:
    """The tables a cleaner run (``clean_tables``) would delete rows from, and why; ``outbox_audit`` too when
    its old rows are due, and each of ``inboxes`` with entries past its window. Only those whose cleaner is on:
    the run skips the others."""
    due: dict[str, str] = {}
    for table in tables:
        if not table.cleaner_enabled:
            continue
        row = _table_row(
            conn,
            "maintenance_clean_due",
            table.name,
            {"now": now, "retention_s": table.retention_s, "dead_retention_s": dead_retention_s},
        )
        why = [what for what, found in (("sent rows", row["sent"]), ("dead rows", row["dead"])) if found]
        if why:
            due[table.name] = f"{' and '.join(why)} past their retention"
    if any(table.cleaner_enabled for table in tables):  # the run cleans the shared tables only then
        with conn.cursor(row_factory=dict_row) as cur:
            kept = audit_kept(conn)
            params = {"now": now, "retention_s": audit_retention_s, "kept": kept, "limit": len(kept) + AUDIT_BATCH}
            cur.execute(shared_query("maintenance_audit_due"), params)
            audit = cur.fetchone()
        if audit and audit["due"]:
            due[AUDIT] = "audit rows past their retention"
    return due | inboxes_due(conn, inboxes, now=now)
