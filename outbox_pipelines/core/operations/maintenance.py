"""Maintenance passes in River's style: one batched statement, looped until a batch comes back short.

A cleaner run is ``clean`` once per outbox table whose cleaner is on, and
``clean_shared`` exactly once for the tables every outbox table shares (the
idempotency ledger, the audit), whichever outbox tables are cleaned.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from outbox_pipelines.core.errors import RetentionTooShort
from outbox_pipelines.core.relay import ordering
from outbox_pipelines.core.settings import TableSettings
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


@dataclass
class SharedCleanReport:
    deleted_ledger: int = 0
    deleted_audit: int = 0


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
                if row["status"] == "dead":
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
            f"{table.name}: a retention of {_human(retention_s)} is shorter than the dedup horizon of "
            f"{_human(minimum)}: sent rows are what makes a repeated event_id a duplicate (and what a "
            "repeated (topic, payload_sha) is answered from), so a message enqueued again, or a copy still "
            f"retrying, would be delivered twice. Keep at least {_human(minimum)} (default 168h), or force it "
            "(--force) if you accept duplicates; nothing was deleted."
        )


def _human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:g}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def clean(
    url: str,
    table: TableSettings,
    *,
    retention_s: float | None = None,
    force: bool = False,
    batch_size: int = 5000,
    tenant_id: str | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> CleanReport:
    """Delete sent rows older than the retention, in bounded batches; never pending, sending or dead.

    A retention shorter than the table's dedup horizon raises RetentionTooShort
    (and deletes nothing) unless ``force``. ``tenant_id`` limits the sent rows
    deleted to that tenant's. The shared tables are ``clean_shared``'s.
    """
    report = CleanReport(table.name)
    retention = table.retention_s if retention_s is None else retention_s
    check_retention(table, retention, force=force)
    with connect(url) as conn:
        outbox_table = OutboxTable(conn, table.name)
        while True:
            deleted = outbox_table.clean_sent(MAINTENANCE_WORKER, retention_s=retention, limit=batch_size,
                                              tenant_id=tenant_id, now=now)
            report.deleted_sent += deleted
            report.batches += 1
            if progress and deleted:
                progress(f"{table.name}: deleted {report.deleted_sent} sent rows")
            if deleted < batch_size:
                return report


def shared_cleanup_due(tables: Sequence[TableSettings], *, force: bool = False) -> bool:
    """The shared tables are cleaned when the cleaner runs for at least one of the chosen tables:
    a cleaner switched off everywhere (OUTBOX_CLEANER_ENABLED=false) deletes nothing at all."""
    return force or any(table.cleaner_enabled for table in tables)


def clean_shared(
    url: str, *, audit_retention_s: float | None, now: datetime | None = None, batch_size: int = 5000
) -> SharedCleanReport:
    """Delete expired idempotency-ledger rows and, when ``audit_retention_s`` is given, audit rows
    older than that; once per cleaner run, whichever outbox tables it cleans."""
    report = SharedCleanReport()
    with connect(url) as conn:
        shared = SharedTables(conn)
        report.deleted_ledger = _until_short(
            lambda: shared.delete_expired_ledger_rows(limit=batch_size, now=now), batch_size)
        if audit_retention_s is not None:
            report.deleted_audit = _until_short(
                lambda: shared.delete_old_audit_rows(retention_s=audit_retention_s, limit=batch_size, now=now),
                batch_size)
    return report


def _until_short(delete_batch: Callable[[], int], batch_size: int) -> int:
    """Run ``delete_batch`` until a batch deletes fewer than ``batch_size`` rows; the total deleted."""
    total = 0
    while True:
        deleted = delete_batch()
        total += deleted
        if deleted < batch_size:
            return total
