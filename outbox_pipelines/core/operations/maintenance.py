"""Maintenance passes in River's style: one batched statement, looped until a batch comes back short.

``clean_tables`` (the CLI's ``clean``, Dagster's ``clean_job``) runs ``clean`` per outbox table whose cleaner is on
and ``clean_shared`` once. Every delete is a batch of at most ``batch_size`` rows in a short transaction of its own,
so the application's writes never wait behind it. What each keeps: docs/how-to/retention.md.
"""

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from outbox_pipelines.core import wings
from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.errors import RetentionTooShort, ThresholdTooShort
from outbox_pipelines.core.inbox import cleaner as inbox_cleaner
from outbox_pipelines.core.models import MessageState
from outbox_pipelines.core.operations.maintenance_due import AUDIT_BATCH, audit_kept
from outbox_pipelines.core.relay import ordering
from outbox_pipelines.core.settings import GlobalSettings, TableSettings
from outbox_pipelines.core.settings.inboxes import InboxSettings
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables

MAINTENANCE_WORKER = "maintenance"
Progress = Callable[[str], None]


@dataclass
class RequeueReport:
    table: str
    requeued: int = 0
    dead: int = 0
    ids: list[int] = field(default_factory=list)
    # Ordering keys let go by the sweep (their next message waited with nothing before it).
    keys_released: int = 0


@dataclass
class CleanReport:
    table: str
    deleted_sent: int = 0
    batches: int = 0
    deleted_dead: int = 0


@dataclass
class SharedCleanReport:
    # Expired rows deleted from each wing's shared table (core/wings.py: shared_cleanups), by table.
    deleted_expired: dict[str, int] = field(default_factory=dict)
    deleted_audit: int = 0


def shared_tables_cleaned() -> list[str]:
    """The shared tables a cleaner run cleans once, after the outbox tables: the wings', then the audit."""
    return [*wings.shared_cleanups(), "outbox_audit"]


def check_stuck_threshold(table: TableSettings, threshold_s: float, *, force: bool = False) -> None:
    """ThresholdTooShort unless ``threshold_s`` (an operator's, for one run) leaves a live relay of ``table`` its
    rows: they move at each lease renewal, every ``renew_every_s``; twice that is the least (or ``force``)."""
    least = 2 * table.renew_every_s
    if threshold_s < least and not force:
        raise ThresholdTooShort(
            f"{table.name}: a threshold of {duration_words(threshold_s)} would take rows from a relay that is alive: "
            f"a running relay renews the rows it holds every {duration_words(table.renew_every_s)}, so they look "
            f"stuck until then, and a row taken from it is delivered twice. Give at least {duration_words(least)} "
            "(rows of a relay that died are requeued once their lease expires, without --threshold), or --force "
            "if no relay of the table is running; nothing was requeued."
        )


def requeue_stuck(
    url: str,
    table: TableSettings,
    *,
    batch_size: int = 1000,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> RequeueReport:
    """Return sending rows whose lease expired (or that sat past the stuck threshold) to pending.

    A row that already used its last attempt goes to dead (LEASE_EXPIRED) instead.
    """
    report = RequeueReport(table.name)
    with connect(url) as conn:
        outbox_table = OutboxTable(conn, table.name)
        while True:
            rows = outbox_table.requeue_stuck(
                MAINTENANCE_WORKER,
                stuck_after_s=table.stuck_threshold_s,
                max_attempts=table.retry.max_attempts,
                limit=batch_size,
                pass_over_dead=table.ordering == "skip",
                now=now,
            )
            for row in rows:
                report.ids.append(row["id"])
                if row["status"] == MessageState.DEAD:
                    report.dead += 1
                else:
                    report.requeued += 1
            if progress and rows:
                progress(f"{table.name}: requeued {report.requeued}, dead {report.dead}")
            if len(rows) < batch_size:
                break
        # Ordering's backstop (core/relay/ordering.py): keys whose next message waits with nothing before it.
        report.keys_released = ordering.sweep_all(outbox_table, table, worker=MAINTENANCE_WORKER)
        ordering.release_contended(outbox_table)
        if progress and report.keys_released:
            progress(f"{table.name}: released {report.keys_released} ordering keys whose next message waited")
    return report


# The shortest retention of sent rows the cleaner accepts without force. Dedup needs the
# sent rows: enqueueing an event_id again is a duplicate only while its row exists, and a
# dedup table answers a repeated (topic, payload_sha) from a sent row. An hour covers a
# producer re-sending the same event (its transaction retried, its own consumer redelivering).
MIN_RETENTION_S = 3600.0


def minimum_retention_s(table: TableSettings) -> float:
    """The dedup horizon of ``table``: the longest a copy still in flight may look back for a sent row.

    A copy of a message enqueued before the original was delivered can still be
    retrying for the table's whole retry horizon (every backoff, jitter
    included, plus one lease per attempt); deleting the sent row sooner lets
    that copy be delivered a second time. At least MIN_RETENTION_S.
    """
    retry = table.retry
    return max(MIN_RETENTION_S, retry.horizon_s() + retry.max_attempts * table.lease_s)


def check_retention(table: TableSettings, retention_s: float, *, force: bool = False) -> None:
    """RetentionTooShort unless ``retention_s`` covers the table's dedup horizon (or ``force``)."""
    minimum = minimum_retention_s(table)
    if retention_s < minimum and not force:
        raise RetentionTooShort(
            f"{table.name}: a retention of {duration_words(retention_s)} is shorter than the dedup horizon of "
            f"{duration_words(minimum)}: sent rows are what makes a repeated event_id a duplicate (and what a "
            "repeated (topic, payload_sha) is answered from), so a message enqueued again, or a copy still "
            f"retrying, would be delivered twice. Keep at least {duration_words(minimum)} (default 168h), or force it "
            "(--force / force: true) if you accept duplicates; nothing was deleted."
        )


def clean(
    url: str,
    table: TableSettings,
    *,
    retention_s: float | None = None,
    force: bool = False,
    batch_size: int = 5000,
    tenant_id: str | None = None,
    dead_retention_s: float | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> CleanReport:
    """Delete sent rows older than the retention, in bounded batches; never pending or sending. With
    ``dead_retention_s``, dead rows dead for longer go too (not one that parks its ordering key).

    A retention shorter than the table's dedup horizon raises RetentionTooShort
    (and deletes nothing) unless ``force``. ``tenant_id`` limits the sent rows
    deleted to that tenant's (and leaves dead rows be). The shared tables are ``clean_shared``'s.
    """
    report = CleanReport(table.name)
    retention = table.retention_s if retention_s is None else retention_s
    check_retention(table, retention, force=force)
    with connect(url) as conn:
        outbox_table = OutboxTable(conn, table.name)
        while True:
            deleted = outbox_table.clean_sent(
                MAINTENANCE_WORKER, retention_s=retention, limit=batch_size, tenant_id=tenant_id, now=now
            )
            report.deleted_sent += deleted
            report.batches += 1
            if progress and deleted:
                progress(f"{table.name}: deleted {report.deleted_sent} sent rows")
            if deleted < batch_size:
                break
        if dead_retention_s is not None and tenant_id is None:
            report.deleted_dead = _until_short(
                partial(
                    outbox_table.clean_dead, MAINTENANCE_WORKER, retention_s=dead_retention_s, limit=batch_size, now=now
                ),
                batch_size,
            )
            if progress and report.deleted_dead:
                progress(f"{table.name}: deleted {report.deleted_dead} dead rows")
    return report


# Why a chosen table is left alone; the callers print it after the table's name.
CLEANER_DISABLED = "cleaner disabled (OUTBOX_CLEANER_ENABLED / cleaner_enabled)"
# Why the shared tables are left alone; the callers print it after their names.
SHARED_NOT_DUE = "not cleaned (the cleaner is disabled for every table chosen)"


@dataclass
class TableCleanOutcome:
    """One chosen table of a cleaner run: the retention it was cleaned with, what went, or why it was skipped."""

    table: str
    retention_s: float
    deleted_sent: int = 0
    skipped: str | None = None  # None: cleaned
    deleted_dead: int = 0


@dataclass
class CleanRunReport:
    """What a cleaner run did: each chosen table in the order given, then the shared tables (None: not due)."""

    tables: list[TableCleanOutcome] = field(default_factory=list)
    shared: SharedCleanReport | None = None
    # Inbox entries deleted past their window, per inbox cleaned; and the inboxes left alone, with why.
    inboxes: dict[str, int] = field(default_factory=dict)
    inboxes_skipped: dict[str, str] = field(default_factory=dict)

    @property
    def deleted_sent_by_table(self) -> dict[str, int]:
        """Sent rows deleted per table cleaned (a skipped table is not in it)."""
        return {t.table: t.deleted_sent for t in self.tables if t.skipped is None}

    @property
    def deleted_sent_total(self) -> int:
        return sum(self.deleted_sent_by_table.values())

    @property
    def deleted_dead_by_table(self) -> dict[str, int]:
        """Dead rows deleted per table cleaned (past the dead retention)."""
        return {t.table: t.deleted_dead for t in self.tables if t.skipped is None}


def clean_tables(
    database_url: Callable[[], str],
    tables: Sequence[TableSettings],
    *,
    retention_s: float | None = None,
    audit_retention_s: float | None = None,
    dead_retention_s: float | None = None,
    force: bool = False,
    tenant_id: str | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
    inboxes: Sequence[InboxSettings] = (),
) -> CleanRunReport:
    """One cleaner run over ``tables``: the rules of ``outbox-pipelines clean`` and of Dagster's ``clean_job``.

    - A table whose cleaner is off (``cleaner_enabled`` / OUTBOX_CLEANER_ENABLED) is skipped
      (``CLEANER_DISABLED``) unless ``force``; every other chosen table is cleaned, in the order given.
    - Before anything is deleted, every table to be cleaned has the retention it will be cleaned with
      (``retention_s`` when given, else the table's own) checked against its dedup horizon: one too
      short raises RetentionTooShort naming the table, and nothing is deleted anywhere. A skipped table
      loses nothing, so its retention is not checked.
    - ``force`` is the operator's override of both: it cleans a table whose cleaner is off and accepts a
      retention shorter than the dedup horizon.
    - Dead rows older than ``dead_retention_s`` go too (None: OUTBOX_CLEANER_DEAD_RETENTION, 30 days), but
      not one that parks its ordering key, and not in a run limited to a tenant.
    - The shared tables are cleaned once, after the outbox tables, when at least one table was cleaned
      (else ``report.shared`` is None: ``SHARED_NOT_DUE``): the wings' expired rows, and audit rows older
      than ``audit_retention_s`` (None: OUTBOX_AUDIT_RETENTION, 30 days). ``tenant_id`` limits the sent
      rows deleted to that tenant's; the shared tables are cleaned regardless.
    - ``database_url`` is called once the run is allowed and has something to delete, so a refused run
      (or one with every cleaner off) never chooses a database, nor starts the embedded one.
    - Each of ``inboxes`` whose cleaner is on (or ``force``) loses its entries older than its window, last.
    """
    report = CleanRunReport(
        [
            TableCleanOutcome(
                table.name,
                _retention_of(table, retention_s),
                skipped=None if _is_cleaned(table, force=force) else CLEANER_DISABLED,
            )
            for table in tables
        ]
    )
    to_clean = [(table, outcome) for table, outcome in zip(tables, report.tables, strict=True) if not outcome.skipped]
    for table, outcome in to_clean:
        check_retention(table, outcome.retention_s, force=force)
    report.inboxes_skipped = {i.name: CLEANER_DISABLED for i in inboxes if not (i.cleaner_enabled or force)}
    to_empty = [inbox for inbox in inboxes if inbox.name not in report.inboxes_skipped]
    if not to_clean and not to_empty:
        return report
    env = GlobalSettings.from_env()  # what a run does not give: OUTBOX_CLEANER_DEAD_RETENTION, OUTBOX_AUDIT_RETENTION
    dead_kept = env.cleaner_dead_retention_s if dead_retention_s is None else dead_retention_s
    audit_kept = env.audit_retention_s if audit_retention_s is None else audit_retention_s
    url = database_url()
    for table, outcome in to_clean:
        cleaned = clean(
            url,
            table,
            retention_s=outcome.retention_s,
            force=force,
            tenant_id=tenant_id,
            dead_retention_s=dead_kept,
            now=now,
            progress=progress,
        )
        outcome.deleted_sent, outcome.deleted_dead = cleaned.deleted_sent, cleaned.deleted_dead
    if to_clean:
        report.shared = clean_shared(url, audit_retention_s=audit_kept, now=now)
    if to_empty:
        with connect(url) as conn:
            found, missing = inbox_cleaner.existing(conn, to_empty)
            report.inboxes_skipped |= missing
            for inbox in found:
                report.inboxes[inbox.name] = inbox_cleaner.clean_inbox(conn, inbox, now=now, progress=progress)
    return report


def _is_cleaned(table: TableSettings, *, force: bool) -> bool:
    """Whether a run cleans ``table``: its cleaner is on, or the run is forced. A cleaner switched off
    everywhere (OUTBOX_CLEANER_ENABLED=false) deletes nothing at all, not even from the shared tables."""
    return table.cleaner_enabled or force


def _retention_of(table: TableSettings, retention_s: float | None) -> float:
    """The retention a run cleans ``table`` with: the run's when it gives one, else the table's own."""
    return table.retention_s if retention_s is None else retention_s


def clean_shared(
    url: str,
    *,
    audit_retention_s: float | None,
    now: datetime | None = None,
    batch_size: int = AUDIT_BATCH,
    progress: Progress | None = None,
) -> SharedCleanReport:
    """Delete the wings' expired shared rows (the order wing's ledger) and, when ``audit_retention_s`` is
    given, audit rows older than that; once per cleaner run, whichever outbox tables it cleans."""
    report = SharedCleanReport()
    with connect(url) as conn:
        for table, delete_batch in wings.shared_cleanups().items():
            report.deleted_expired[table] = _until_short(partial(delete_batch, conn, batch_size, now), batch_size)
        if audit_retention_s is not None:
            report.deleted_audit = delete_old_audit(
                SharedTables(conn), audit_retention_s, batch_size=batch_size, now=now, progress=progress
            )
    return report


def delete_old_audit(
    shared: SharedTables,
    retention_s: float,
    *,
    batch_size: int = AUDIT_BATCH,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> int:
    """Audit rows older than ``retention_s``, deleted in batches of ``batch_size`` consecutive ids, each its own
    short transaction (``shared``'s connection in autocommit), walking the primary key from the oldest id on:
    no batch re-reads what an earlier one deleted, and none touches more than ``batch_size`` rows however big
    the audit is. The audit is written in time order, so the walk stops at the first batch with nothing old
    in it (or at the end); the total deleted. The rows of messages still dead are kept (``audit_kept``)."""
    total, after, kept = 0, 0, audit_kept(shared.conn)
    while True:
        first = bisect.bisect_right(kept, after)  # the kept ids a batch past ``after`` can hold: at most its size
        batch = shared.delete_old_audit_rows(
            retention_s=retention_s, limit=batch_size, kept=kept[first : first + batch_size], after_id=after, now=now
        )
        total += int(batch["deleted"])
        if progress and batch["deleted"]:
            progress(f"outbox_audit: deleted {total} rows")
        if not batch["old"] or int(batch["seen"]) < batch_size:
            return total
        after = int(batch["last_id"])


def _until_short(delete_batch: Callable[[], int], batch_size: int) -> int:
    """Run ``delete_batch`` until a batch deletes fewer than ``batch_size`` rows; the total deleted."""
    total = 0
    while True:
        deleted = delete_batch()
        total += deleted
        if deleted < batch_size:
            return total
