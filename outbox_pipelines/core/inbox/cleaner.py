"""The inboxes' share of the cleaner (core/operations/maintenance.py): entries received longer ago than their
inbox's window, deleted in bounded batches, each its own short transaction; and whether any are due."""

from collections.abc import Callable, Iterable
from datetime import datetime

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.inbox.schema import inbox_tables
from outbox_pipelines.core.settings.inboxes import InboxSettings
from outbox_pipelines.core.storage.queries import table_query
from outbox_pipelines.core.storage.shared_tables import SharedTables

# The most entries the cleaner gate counts in one inbox (it says "1000+" past it): a count, never a scan.
DUE_COUNT_CAP = 1000
NOT_CREATED = "not created yet: run 'outbox-pipelines db upgrade'"
NOT_AN_INBOX = "a table that is not an inbox has this name: give its [inboxes.NAME] section another name"


def clean_inbox(
    conn: psycopg.Connection,
    inbox: InboxSettings,
    *,
    batch_size: int = 5000,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Delete ``inbox``'s entries older than its window, ``batch_size`` at a time, oldest first (``conn`` in
    autocommit: each batch commits on its own); how many went."""
    statement = table_query("inbox_clean_batch", inbox.name)
    total = 0
    while True:
        with conn.cursor() as cur:
            cur.execute(statement, {"now": now, "window_s": inbox.window_s, "limit": batch_size})
            deleted = cur.rowcount
        total += deleted
        if progress and deleted:
            progress(f"{inbox.name}: deleted {total} inbox entries")
        if deleted < batch_size:
            return total


def existing(conn: psycopg.Connection, inboxes: Iterable[InboxSettings]) -> tuple[list[InboxSettings], dict[str, str]]:
    """Those of ``inboxes`` the database has, and why each other one is not cleaned: never created, or its name is
    another kind of table's (which ``db upgrade`` refuses to make an inbox of)."""
    found = set(inbox_tables(conn))
    chosen = list(inboxes)
    shared = SharedTables(conn)
    why = {i.name: NOT_AN_INBOX if shared.find_relation(i.name) else NOT_CREATED for i in chosen if i.name not in found}
    return [i for i in chosen if i.name in found], why


def inboxes_due(
    conn: psycopg.Connection, inboxes: Iterable[InboxSettings], *, now: datetime | None = None
) -> dict[str, str]:
    """The inboxes (cleaner on, created) with entries past their window, and how many (up to DUE_COUNT_CAP)."""
    due: dict[str, str] = {}
    for inbox in existing(conn, (i for i in inboxes if i.cleaner_enabled))[0]:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                table_query("inbox_clean_due", inbox.name),
                {"now": now, "window_s": inbox.window_s, "cap": DUE_COUNT_CAP},
            )
            row = cur.fetchone()
        count = int(row["due"]) if row else 0
        if count:
            shown = f"{DUE_COUNT_CAP}+" if count >= DUE_COUNT_CAP else str(count)
            due[inbox.name] = f"{shown} inbox entries past their window"
    return due
