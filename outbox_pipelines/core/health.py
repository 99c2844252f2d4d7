"""What an operator asks first: how many rows in each state, how late, how many dead and why."""

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

import psycopg

from outbox_pipelines.core.db import connect
from outbox_pipelines.core.models import STATES
from outbox_pipelines.core.settings import CheckThresholds
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


Severity = Literal["ok", "warn", "error"]
CHECK_NAMES = ("lag", "dead_letters", "stuck", "backlog")


@dataclass(frozen=True)
class CheckVerdict:
    name: str
    severity: Severity
    description: str
    metadata: dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.severity == "ok"


def _grade(value: float | None, warn: float, error: float) -> Severity:
    if value is None:
        return "ok"
    if value >= error:
        return "error"
    if value >= warn:
        return "warn"
    return "ok"


def _worst(*severities: Severity) -> Severity:
    return "error" if "error" in severities else "warn" if "warn" in severities else "ok"


def evaluate_checks(status: TableStatus, limits: CheckThresholds) -> list[CheckVerdict]:
    """The four health checks of a table, graded against its thresholds, with their numbers."""
    lag_grade = _worst(
        _grade(status.lag_p95_s, limits.lag_p95_warn_s, limits.lag_p95_error_s),
        _grade(status.oldest_pending_age_s if status.ready else None, limits.oldest_pending_warn_s, limits.oldest_pending_error_s),
    )
    dead = status.counts.get("dead", 0)
    verdicts = [
        CheckVerdict(
            "lag",
            lag_grade,
            f"lag p95 {_fmt(status.lag_p95_s)} (warn {_fmt(limits.lag_p95_warn_s)}), oldest ready pending "
            f"{_fmt(status.oldest_pending_age_s if status.ready else None)} (warn {_fmt(limits.oldest_pending_warn_s)})",
            {
                "lag_p50_s": status.lag_p50_s, "lag_p95_s": status.lag_p95_s, "lag_p99_s": status.lag_p99_s,
                "lag_sample": status.lag_sample, "oldest_pending_age_s": status.oldest_pending_age_s,
                "ready": status.ready, "lag_p95_warn_s": limits.lag_p95_warn_s, "lag_p95_error_s": limits.lag_p95_error_s,
            },
        ),
        CheckVerdict(
            "dead_letters",
            _grade(dead, limits.dead_warn, limits.dead_error),
            f"{dead} dead message{'' if dead == 1 else 's'}" + (f" ({', '.join(f'{k}={v}' for k, v in status.dead_by_code.items())})" if dead else ""),
            {"dead": dead, "dead_warn": limits.dead_warn, "dead_error": limits.dead_error,
             **{f"dead_{code}": n for code, n in status.dead_by_code.items()}},
        ),
        CheckVerdict(
            "stuck",
            _grade(status.stuck, limits.stuck_warn, limits.stuck_error),
            f"{status.stuck} message{'' if status.stuck == 1 else 's'} stuck in sending past their lease or the stuck threshold",
            {"stuck": status.stuck, "sending": status.counts.get("sending", 0),
             "stuck_warn": limits.stuck_warn, "stuck_error": limits.stuck_error},
        ),
        CheckVerdict(
            "backlog",
            _grade(status.backlog, limits.backlog_warn, limits.backlog_error),
            f"{status.backlog} message{'' if status.backlog == 1 else 's'} waiting ({status.ready} ready now)",
            {"backlog": status.backlog, "pending": status.counts.get("pending", 0),
             "retrying": status.counts.get("retrying", 0), "ready": status.ready,
             "backlog_warn": limits.backlog_warn, "backlog_error": limits.backlog_error},
        ),
    ]
    return verdicts


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def ready_count(conn: psycopg.Connection, table: str, paused_topics: tuple[str, ...] = ()) -> int:
    return int(OutboxTable(conn, table).status_rows("outbox_ready_count", paused_topics=list(paused_topics))[0]["ready"])
