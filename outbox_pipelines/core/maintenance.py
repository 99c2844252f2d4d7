"""Maintenance passes in River's style: one batched statement, looped until a batch comes back short."""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.queries import shared_query
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.table import OutboxTable

MAINTENANCE_WORKER = "maintenance"
Progress = Callable[[str], None]


@dataclass
class RequeueReport:
    table: str
    requeued: int = 0
    dead: int = 0
    ids: list[int] = field(default_factory=list)


@dataclass
class CleanReport:
    table: str
    deleted_sent: int = 0
    deleted_ledger: int = 0
    deleted_audit: int = 0
    batches: int = 0


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
        store = OutboxTable(conn, table.name)
        while True:
            rows = store.requeue_stuck(
                MAINTENANCE_WORKER,
                stuck_after_s=table.stuck_threshold_s,
                max_attempts=table.retry.max_attempts,
                limit=batch_size,
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
                return report


def clean(
    url: str,
    table: TableSettings,
    *,
    retention_s: float | None = None,
    batch_size: int = 5000,
    include_shared: bool = True,
    audit_retention_s: float | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> CleanReport:
    """Delete sent rows older than the retention, in bounded batches; never pending, sending or dead.

    With ``include_shared``, also expired idempotency-ledger rows and, when
    ``audit_retention_s`` is given, audit rows older than that.
    """
    report = CleanReport(table.name)
    retention = table.retention_s if retention_s is None else retention_s
    with connect(url) as conn:
        store = OutboxTable(conn, table.name)
        while True:
            deleted = store.clean_sent(MAINTENANCE_WORKER, retention_s=retention, limit=batch_size, now=now)
            report.deleted_sent += deleted
            report.batches += 1
            if progress and deleted:
                progress(f"{table.name}: deleted {report.deleted_sent} sent rows")
            if deleted < batch_size:
                break
        if include_shared:
            report.deleted_ledger = _loop_delete(conn, "idempo_ledger_clean_expired", {"now": now}, batch_size)
            if audit_retention_s is not None:
                report.deleted_audit = _loop_delete(
                    conn, "outbox_audit_clean_old", {"now": now, "retention_s": audit_retention_s}, batch_size
                )
    return report


def _loop_delete(conn: Any, query: str, params: dict[str, Any], batch_size: int) -> int:
    total = 0
    while True:
        cur = conn.execute(shared_query(query), {**params, "limit": batch_size})
        total += cur.rowcount
        if cur.rowcount < batch_size:
            return total
