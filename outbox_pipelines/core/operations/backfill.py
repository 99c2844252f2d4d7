"""Backfill: deliver again the sent messages of a time window, with their own idempotency keys.

Rows are not changed (they stay sent); the destination sees the same
``Idempotency-Key`` as the first time, so a destination that already has a
message treats it as a repeat. One audit row records the backfill.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome, OutcomeKind
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable

Progress = Callable[[str], None]


@dataclass
class BackfillReport:
    table: str
    start: datetime
    end: datetime
    found: int = 0
    delivered: int = 0
    failed: int = 0
    failures_by_code: dict[str, int] = field(default_factory=dict)
    failed_ids: list[int] = field(default_factory=list)


def redeliver_sent(
    url: str,
    table_name: str,
    destination: Destination,
    start: datetime,
    end: datetime,
    *,
    batch_size: int = 500,
    progress: Progress | None = None,
    actor: str = "backfill",
    reason: str | None = None,
) -> BackfillReport:
    """Deliver the window's sent messages again; one audit row says how many, where, and ``reason`` (why)."""
    report = BackfillReport(table_name, start, end)
    after_id = 0
    with connect(url) as conn:
        outbox_table = OutboxTable(conn, table_name)
        while True:
            messages = outbox_table.sent_in_window(start=start, end=end, after_id=after_id, limit=batch_size)
            if not messages:
                break
            # A destination answers one outcome per message, in order (the Destination protocol).
            _tally(report, messages, destination.deliver(messages))
            after_id = messages[-1].id
            if progress:
                progress(f"{table_name}: {report.found} sent messages re-delivered so far ({report.failed} failed)")
            if len(messages) < batch_size:
                break
        outbox_table.audit_note(
            code="outbox_backfill",
            worker=actor,
            detail=f"re-delivered {report.delivered} of {report.found} sent messages published in "
            f"[{start.isoformat()}, {end.isoformat()}) to {destination.name}; {report.failed} failed"
            + (f" ({reason})" if reason else ""),
        )
    return report


def _tally(report: BackfillReport, messages: list[ClaimedMessage], outcomes: Sequence[Outcome]) -> None:
    for message, outcome in zip(messages, outcomes, strict=False):
        if outcome.kind == OutcomeKind.SENT:
            report.delivered += 1
        else:
            report.failed += 1
            report.failed_ids.append(message.id)
            code = outcome.code or "UNKNOWN"
            report.failures_by_code[code] = report.failures_by_code.get(code, 0) + 1
    report.found += len(messages)
