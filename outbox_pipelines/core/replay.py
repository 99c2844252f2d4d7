"""Replay of dead messages: an explicit operator action, filtered, with a dry run."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.table import OutboxTable

REPLAY_WORKER = "replay"


@dataclass(frozen=True)
class ReplayFilter:
    ids: tuple[int, ...] | None = None
    topic: str | None = None
    tenant_id: str | None = None
    error_code: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def is_empty(self) -> bool:
        return all(v is None for v in (self.ids, self.topic, self.tenant_id, self.error_code, self.since, self.until))


@dataclass
class ReplayReport:
    table: str
    dry_run: bool
    matched: int = 0
    replayed: int = 0
    refused: int = 0
    replayed_ids: list[int] = field(default_factory=list)
    refused_ids: list[int] = field(default_factory=list)
    by_error_code: dict[str, int] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        text = f"{self.table}: {self.matched} dead rows matched, {verb} {self.replayed if not self.dry_run else self.matched - self.refused}"
        if self.refused:
            text += f", refused {self.refused} BAD_REQUEST rows (use --force to replay them)"
        return text


def replay_dead(
    url: str,
    table: str,
    selection: ReplayFilter,
    *,
    dry_run: bool = False,
    force: bool = False,
    batch_size: int = 1000,
    actor: str = REPLAY_WORKER,
    now: datetime | None = None,
) -> ReplayReport:
    """Move matching dead rows back to pending with attempts reset (audited as outbox_replay).

    Rows that died of BAD_REQUEST are refused unless ``force``: the input was
    invalid and replaying it will fail the same way.
    """
    validate_table_name(table)
    report = ReplayReport(table, dry_run)
    after_id = 0
    with connect(url) as conn:
        store = OutboxTable(conn, table)
        while True:
            rows = store.replay_dead(
                actor,
                after_id=after_id,
                ids=list(selection.ids) if selection.ids is not None else None,
                topic=selection.topic,
                tenant_id=selection.tenant_id,
                error_code=selection.error_code,
                since=selection.since,
                until=selection.until,
                force=force,
                dry_run=dry_run,
                limit=batch_size,
                now=now,
            )
            _tally(report, rows)
            if len(rows) < batch_size:
                return report
            after_id = rows[-1]["id"]


def _tally(report: ReplayReport, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        report.matched += 1
        code = row["last_error_code"] or "UNKNOWN"
        report.by_error_code[code] = report.by_error_code.get(code, 0) + 1
        if row["refused"]:
            report.refused += 1
            report.refused_ids.append(row["id"])
        elif row["replayed"]:
            report.replayed += 1
            report.replayed_ids.append(row["id"])
