"""Which dead rows a replay moves: the filter an operator gives (ids, topic, tenant, error code, a time window),
how its times and ids are read, and the one rule that a replay needs a filter (``check_filter``), which the CLI
and the Dagster launch both apply."""

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox_pipelines.core.errors import OutboxError
from outbox_pipelines.core.settings.values import MAX_DURATION_S, MAX_DURATION_TEXT

BIGINT_MAX = 2**63 - 1

TIME_FORMAT = "use ISO 8601 like 2026-11-21T10:00:00Z, a date like 2026-11-21, or a time ago like 30m, 2h, 7d"

_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)(?:\s+ago)?\s*$", re.IGNORECASE)
_AGO_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class ReplayRefused(OutboxError, ValueError):
    """A replay request that cannot run as given; nothing was read or changed. The message says what to set.

    ``field`` is the input that was wrong (``since``, ``ids``, ``error_code``; ``filter`` when none was given),
    so a caller can tell the operator which of its own options to change (Dagster names its config field).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def parse_death_time(value: str, name: str) -> datetime | timedelta:
    """``since`` / ``until`` as given by an operator: an aware datetime, or a timedelta meaning "that long ago"."""
    text = str(value).strip()
    ago = _AGO.match(text)
    if ago:
        seconds = float(ago.group(1)) * _AGO_UNITS[ago.group(2).lower()]
        if seconds > MAX_DURATION_S:  # the one bound of every duration (core/settings/values.py)
            raise ReplayRefused(
                f"{name}={json.dumps(str(value))} is further back than {MAX_DURATION_TEXT}: write a time ago up to "
                "that, or a date",
                name,
            )
        return timedelta(seconds=seconds)
    try:
        if text.endswith(("z", "Z")):
            text = text[:-1] + "+00:00"
        parsed = datetime.fromisoformat(text)
        parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        parsed.astimezone(UTC)  # a date at the calendar's edge (9999-12-31T23:00-05:00) has no UTC time
    except (ValueError, OverflowError):
        raise ReplayRefused(f"{name}={json.dumps(str(value))} is not a time: {TIME_FORMAT}", name) from None
    return parsed


def check_row_id(value: int, name: str = "id") -> int:
    """A row id must fit PostgreSQL's bigint."""
    if not -BIGINT_MAX - 1 <= int(value) <= BIGINT_MAX:
        raise ReplayRefused(f"{name}={value} does not fit a row id (bigint, at most {BIGINT_MAX})", name)
    return int(value)


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _ago_text(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    for unit in ("w", "d", "h", "m"):
        if seconds >= _AGO_UNITS[unit] and seconds % _AGO_UNITS[unit] == 0:
            return f"{int(seconds // _AGO_UNITS[unit])}{unit} ago"
    return f"{seconds:g}s ago"


@dataclass(frozen=True)
class ReplayFilter:
    """Which dead rows to replay; None = any. ``since``/``until`` may be a timedelta meaning "that long ago"."""

    ids: tuple[int, ...] | None = None
    topic: str | None = None
    tenant_id: str | None = None
    error_code: str | None = None
    since: datetime | timedelta | None = None  # died at or after
    until: datetime | timedelta | None = None  # died before

    def is_empty(self) -> bool:
        return all(v is None for v in (self.ids, self.topic, self.tenant_id, self.error_code, self.since, self.until))

    def describe(self, as_given: "ReplayFilter | None" = None) -> str:
        """One line a person can read back: the filter exactly as it is applied (with "2h ago" as given)."""
        if self.is_empty():
            return "all dead rows (no filter)"
        parts = []
        if self.ids is not None:
            parts.append("id in " + ",".join(str(i) for i in self.ids))
        for label, value in (("topic", self.topic), ("tenant", self.tenant_id), ("error_code", self.error_code)):
            if value is not None:
                parts.append(f"{label}={value}")
        given = as_given or self
        for label, bound, original in (
            ("died at or after", self.since, given.since),
            ("died before", self.until, given.until),
        ):
            if isinstance(bound, timedelta):
                parts.append(f"{label} {_ago_text(bound)}")
            elif bound is not None:
                ago = f" ({_ago_text(original)})" if isinstance(original, timedelta) else ""
                parts.append(f"{label} {iso(bound)}{ago}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        def when(value: datetime | timedelta | None) -> str | None:
            return _ago_text(value) if isinstance(value, timedelta) else iso(value)

        return {
            "ids": list(self.ids) if self.ids is not None else None,
            "topic": self.topic,
            "tenant_id": self.tenant_id,
            "error_code": self.error_code,
            "since": when(self.since),
            "until": when(self.until),
        }


# The one rule a replay's selection obeys, in the words both callers show: replay_dead_job's config fields, then
# the command line's options. ``check_filter`` enforces it; a description of the ``all`` option may quote it.
NEEDS_A_FILTER = (
    "replay needs a filter: set ids, topic, tenant_id, error_code, since or until (--id, --topic, --tenant, "
    "--error-code, --since, --until), or set all: true (--all) to replay every dead row of the table."
)


def check_filter(selection: ReplayFilter, *, allow_all: bool) -> None:
    """The checks that need no database: a filter (or allow_all), ids that fit bigint, since before until.

    The CLI's ``replay`` and Dagster's ``replay_dead_job`` call it before choosing a database, ``replay_dead``
    again; a selection with no filter and no ``allow_all`` is refused with ``NEEDS_A_FILTER`` (field "filter").
    """
    if selection.is_empty() and not allow_all:
        raise ReplayRefused(f"{NEEDS_A_FILTER} Nothing was touched.", "filter")
    for value in selection.ids or ():
        check_row_id(value)
    since, until = selection.since, selection.until
    if isinstance(since, datetime) and isinstance(until, datetime) and since >= until:
        raise ReplayRefused(f"since ({iso(since)}) must be before until ({iso(until)}): nothing can match", "since")
