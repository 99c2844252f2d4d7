"""Replay of dead messages: an explicit operator action, filtered, with a dry run.

``outbox-pipelines replay`` and Dagster's ``replay_dead_job`` share these checks: a filter is needed unless
``allow_all``; an unknown error code is refused with the known ones; ``since``/``until`` are the time of death in
database time. The rules: docs/how-to/replay.md.
"""

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.operations.replay_filter import (
    BIGINT_MAX,
    NEEDS_A_FILTER,
    TIME_FORMAT,
    ReplayFilter,
    ReplayRefused,
    check_filter,
    check_row_id,
    iso,
    parse_death_time,
)
from outbox_pipelines.core.redaction import mask_credentials
from outbox_pipelines.core.settings.values import free_text
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables

REPLAY_WORKER = "replay"

# Rows listed (with their details) in a report; every row is counted.
LIST_LIMIT = 100

# The codes a dead row can carry, from core/models.py (docs/reference/outcomes.md) and the
# places that write codes of their own: http/outcomes.py ("CONFLICT", a 409
# without "already processed"), relay.py ("DB_ERROR"), the stuck requeue
# ("LEASE_EXPIRED") and PermanentError's default ("PERMANENT"). Handlers may
# declare other codes; those are accepted when the table has dead rows with them.
KNOWN_ERROR_CODES: tuple[str, ...] = (
    m.BAD_REQUEST,
    m.UNAUTHORIZED,
    m.BROKER_5XX,
    m.NETWORK_TIMEOUT,
    *sorted(m.NETWORK_FAILURES - {m.NETWORK_TIMEOUT}),
    m.RATE_LIMITED,
    m.UNKNOWN,
    m.NO_SUBSCRIBERS,
    m.HANDLER_ERROR,
    m.HANDLER_TIMEOUT,
    "CONFLICT",
    m.ErrorCode.LEASE_EXPIRED,
    m.ErrorCode.DB_ERROR,
    m.ErrorCode.PERMANENT,
)


@dataclass(frozen=True)
class ReplayRow:
    """One matched dead row, as listed to the operator."""

    id: int
    event_id: str
    topic: str
    tenant_id: str | None
    error_code: str
    died_at: datetime | None
    # Why it died, as stored, with credentials masked again (a handler's exception text is the application's,
    # never scrubbed when it was written): what the operator fixes first.
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event_id,
            "topic": self.topic,
            "tenant_id": self.tenant_id,
            "error_code": self.error_code,
            "died_at": iso(self.died_at),
            "last_error": self.last_error,
        }


ROW_COLUMNS = ("id", "event_id", "topic", "error code", "died at", "last error")
# A listed row's error, on one line: the whole text is in --json and in the row.
ERROR_CELL_CHARS = 120


def _error_cell(error: str | None) -> str:
    if not error:
        return "-"
    one_line = " ".join(error.split())
    return one_line if len(one_line) <= ERROR_CELL_CHARS else one_line[: ERROR_CELL_CHARS - 1] + "…"


def _cells(row: ReplayRow) -> tuple[str, ...]:
    died = iso(row.died_at.replace(microsecond=0)) if row.died_at is not None else None
    return (str(row.id), row.event_id, row.topic, row.error_code, died or "-", _error_cell(row.last_error))


def markdown_table(rows: list[ReplayRow], total: int) -> str:
    """A Markdown table of ``rows``; says how many more there are when ``total`` is larger."""
    if not rows:
        return "_no rows_"

    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    def code(text: str) -> str:
        # The error is partly what a third party wrote (an answer's body): shown as code, never rendered (no
        # link or image of theirs in the Dagster UI). Backticks would end the span; pipes, the table cell.
        return text if text == "-" else "`" + text.replace("`", "'").replace("|", "\\|") + "`"

    lines = ["| " + " | ".join(ROW_COLUMNS) + " |", "|" + "---|" * len(ROW_COLUMNS)]
    for row in rows:
        *shown, error = _cells(row)
        lines.append("| " + " | ".join([*map(cell, shown), code(error)]) + " |")
    if total > len(rows):
        lines.append(f"\n… and {total - len(rows)} more (first {len(rows)} of {total} listed)")
    return "\n".join(lines)


def text_table(rows: list[ReplayRow], total: int, indent: str = "  ") -> str:
    """An aligned plain-text table of ``rows`` for a terminal."""
    if not rows:
        return indent + "(none)"
    cells = [ROW_COLUMNS] + [_cells(row) for row in rows]
    widths = [min(max(len(c[i]) for c in cells), 40) for i in range(len(ROW_COLUMNS))]
    lines = [
        indent
        + "  ".join(
            c[i].rjust(widths[i]) if i == 0 else c[i].ljust(widths[i]) for i in range(len(ROW_COLUMNS))
        ).rstrip()
        for c in cells
    ]
    if total > len(rows):
        lines.append(f"{indent}… and {total - len(rows)} more (first {len(rows)} of {total} listed)")
    return "\n".join(lines)


@dataclass
class ReplayReport:
    table: str
    dry_run: bool
    filter: str = ""
    selection: ReplayFilter = field(default_factory=ReplayFilter)  # as applied: times resolved
    matched: int = 0
    replayed: int = 0  # rows that moved (0 in a dry run)
    refused: int = 0
    # Ids that moved, or in a dry run would move; ids refused (BAD_REQUEST without force).
    replayed_ids: list[int] = field(default_factory=list)
    refused_ids: list[int] = field(default_factory=list)
    by_error_code: dict[str, int] = field(default_factory=dict)
    # Details of the first LIST_LIMIT rows that moved (would move), and of the first refused ones.
    rows: list[ReplayRow] = field(default_factory=list)
    refused_rows: list[ReplayRow] = field(default_factory=list)

    @property
    def would_replay(self) -> int:
        """Rows that move (or would move in a dry run): matched minus refused."""
        return self.matched - self.refused

    @property
    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        moved = self.would_replay if self.dry_run else self.replayed
        text = f"{self.table}: {self.matched} dead rows matched, {verb} {moved}"
        if self.refused:
            text += (
                f", refused {self.refused} {'/'.join(m.REPLAY_NEEDS_FORCE)} rows "
                "(use --force / force: true to replay them)"
            )
        return text

    def rows_markdown(self) -> str:
        return markdown_table(self.rows, self.would_replay)

    def refused_markdown(self) -> str:
        return markdown_table(self.refused_rows, self.refused)

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "filter": self.filter,
            "selection": self.selection.as_dict(),
            "matched": self.matched,
            "would_replay": self.would_replay,
            "replayed": self.replayed,
            "refused": self.refused,
            "by_error_code": self.by_error_code,
            "rows": [r.as_dict() for r in self.rows],
            "rows_listed": len(self.rows),
            "refused_rows": [r.as_dict() for r in self.refused_rows],
            "replayed_ids": self.replayed_ids,
            "refused_ids": self.refused_ids,
        }


def resolve_error_code(code: str, dead_codes: list[str], table_name: str) -> str:
    """The code as the filter uses it (upper case when known), or ReplayRefused listing the codes that exist."""
    wanted = code.strip()
    known = {c.upper(): c for c in KNOWN_ERROR_CODES}
    present = {c.upper(): c for c in dead_codes}
    if wanted.upper() in known:
        return known[wanted.upper()]
    if wanted.upper() in present:
        return present[wanted.upper()]
    in_table = ", ".join(sorted(dead_codes)) or "none (the table has no dead rows)"
    raise ReplayRefused(
        f"error code {wanted!r} is unknown: known codes are {', '.join(KNOWN_ERROR_CODES)}; "
        f"dead rows of {table_name} have: {in_table} (codes match case-insensitively)",
        "error_code",
    )


def _resolve_times(selection: ReplayFilter, conn: psycopg.Connection, now: datetime | None) -> ReplayFilter:
    if not isinstance(selection.since, timedelta) and not isinstance(selection.until, timedelta):
        return selection
    if now is None:  # the database's clock, never the application's (docs/explanation/tables-and-states.md)
        now = SharedTables(conn).database_now()
    since, until = (now - v if isinstance(v, timedelta) else v for v in (selection.since, selection.until))
    resolved = replace(selection, since=since, until=until)
    check_filter(resolved, allow_all=True)
    return resolved


def _resolved(bound: datetime | timedelta | None) -> datetime | None:
    """A since/until bound once ``_resolve_times`` has turned "that long ago" into a time."""
    assert not isinstance(bound, timedelta), "resolve the filter's times first"
    return bound


def replay_dead(
    url: str,
    table_name: str,
    selection: ReplayFilter,
    *,
    dry_run: bool = False,
    force: bool = False,
    allow_all: bool = False,
    batch_size: int = 1000,
    actor: str = REPLAY_WORKER,
    reason: str = "",
    now: datetime | None = None,
) -> ReplayReport:
    """Move matching dead rows back to pending with attempts reset (audited as outbox_replay).

    Rows that died of BAD_REQUEST are refused unless ``force``: the input was
    invalid and replaying it will fail the same way. An empty filter is refused
    (ReplayRefused) unless ``allow_all``; so is an unknown error code. ``reason``
    (why; '' = none given) is kept in each audit row's detail, before the error
    the row died of: one printable line, as a skip's reason (ReplayRefused if not).
    """
    check_filter(selection, allow_all=allow_all)
    reason = _reason(reason)
    as_given = selection
    with connect(url) as conn:
        outbox_table = OutboxTable(conn, table_name)
        selection = _resolve_times(selection, conn, now)
        if selection.error_code is not None:
            dead_codes = list(outbox_table.dead_counts_by_code())
            code = resolve_error_code(selection.error_code, dead_codes, table_name)
            selection = replace(selection, error_code=code)
        report = ReplayReport(table_name, dry_run, filter=selection.describe(as_given), selection=selection)
        after_id = 0
        while True:
            rows = outbox_table.replay_dead(
                actor,
                after_id=after_id,
                ids=selection.ids,
                topic=selection.topic,
                tenant_id=selection.tenant_id,
                error_code=selection.error_code,
                since=_resolved(selection.since),
                until=_resolved(selection.until),
                force=force,
                dry_run=dry_run,
                limit=batch_size,
                reason=reason,
                now=now,
            )
            _tally(report, rows)
            if len(rows) < batch_size:
                return report
            after_id = rows[-1]["id"]


def _reason(reason: str) -> str:
    """The reason as the audit keeps it: one printable line (the rule of a skip's and a backfill's reason)."""
    try:
        return free_text(reason, "reason")
    except ConfigError as exc:
        raise ReplayRefused(str(exc), "reason") from None


def _tally(report: ReplayReport, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        report.matched += 1
        code = row["last_error_code"] or m.UNKNOWN
        report.by_error_code[code] = report.by_error_code.get(code, 0) + 1
        error = row.get("last_error")
        detail = ReplayRow(
            row["id"],
            row["event_id"],
            row["topic"],
            row["tenant_id"],
            code,
            row.get("died_at"),
            mask_credentials(error) if error else None,
        )
        if row["refused"]:
            report.refused += 1
            report.refused_ids.append(row["id"])
            if len(report.refused_rows) < LIST_LIMIT:
                report.refused_rows.append(detail)
        elif row["replayed"] or report.dry_run:
            report.replayed += 0 if report.dry_run else 1
            report.replayed_ids.append(row["id"])
            if len(report.rows) < LIST_LIMIT:
                report.rows.append(detail)


__all__ = [
    "BIGINT_MAX",
    "LIST_LIMIT",
    "NEEDS_A_FILTER",
    "REPLAY_WORKER",
    "TIME_FORMAT",
    "ReplayFilter",
    "ReplayRefused",
    "ReplayReport",
    "ReplayRow",
    "check_filter",
    "check_row_id",
    "iso",
    "markdown_table",
    "parse_death_time",
    "replay_dead",
    "resolve_error_code",
    "text_table",
]
