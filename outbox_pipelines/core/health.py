"""What an operator asks first: how many rows in each state, how late, how many dead and why."""

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.models import STATES
from outbox_pipelines.core.table import OutboxTable

LAG_WINDOW_S = 3600.0


@dataclass
class TableStatus:
    table: str
    counts: dict[str, int] = field(default_factory=dict)
    ready: int = 0
    oldest_pending_age_s: float | None = None
    next_due_in_s: float | None = None
    stuck: int = 0
    lag_window_s: float = LAG_WINDOW_S
    lag_sample: int = 0
    lag_p50_s: float | None = None
    lag_p95_s: float | None = None
    lag_p99_s: float | None = None
    dead_by_code: dict[str, int] = field(default_factory=dict)

    @property
    def backlog(self) -> int:
        return self.counts.get("pending", 0) + self.counts.get("retrying", 0)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["backlog"] = self.backlog
        return data


def table_status(
    url: str, table: str, *, stuck_after_s: float = 600.0, window_s: float = LAG_WINDOW_S, now: datetime | None = None
) -> TableStatus:
    with connect(url) as conn:
        return read_status(OutboxTable(conn, table), stuck_after_s=stuck_after_s, window_s=window_s, now=now)


def read_status(
    store: OutboxTable, *, stuck_after_s: float = 600.0, window_s: float = LAG_WINDOW_S, now: datetime | None = None
) -> TableStatus:
    status = TableStatus(store.table, counts={state: 0 for state in STATES}, lag_window_s=window_s)
    for row in store.status_rows("outbox_status_counts"):
        status.counts[row["state"]] = int(row["n"])
    pending = store.status_rows("outbox_status_pending", now=now)[0]
    status.ready = int(pending["ready"])
    status.oldest_pending_age_s = pending["oldest_pending_age_s"]
    status.next_due_in_s = pending["next_due_in_s"]
    status.stuck = int(store.status_rows("outbox_status_stuck", now=now, stuck_after_s=stuck_after_s)[0]["stuck"])
    lag = store.status_rows("outbox_status_lag", now=now, window_s=window_s)[0]
    status.lag_sample = int(lag["n"])
    status.lag_p50_s, status.lag_p95_s, status.lag_p99_s = lag["p50"], lag["p95"], lag["p99"]
    status.dead_by_code = {row["error_code"]: int(row["n"]) for row in store.status_rows("outbox_status_dead_by_code")}
    return status
