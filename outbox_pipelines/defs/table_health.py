"""A table's health where open-source Dagster shows it: the table's state as the checks saw it, recorded as a
materialization of its asset just before its check evaluations, and the messages behind a failing check.

Why a materialization: docs/explanation/front-ends.md, "A table's health in Dagster's UI".
"""

from collections.abc import Iterable
from datetime import UTC
from typing import Any

import dagster as dg

from outbox_pipelines.core.models import HEALTH_OF, SEVERITY_RANK, CheckSeverity
from outbox_pipelines.core.oncall.checks import CheckVerdict
from outbox_pipelines.core.oncall.message_rows import MessageRow, blocked_messages, dead_messages
from outbox_pipelines.defs.common import metadata_values, table_asset_key
from outbox_pipelines.defs.links import oncall_page_url

# A table's health by its worst check.
HEALTH = HEALTH_OF
_RANK = SEVERITY_RANK
# The most messages a check's page lists (newest first): the on-call page has them all.
MESSAGE_ROWS = 20
ERROR_TEXT_CHARS = 300
# The figures of a table's state, from its checks' own metadata: (check, figure), in the order shown.
FIGURES = (
    ("backlog", "pending"),
    ("backlog", "retrying"),
    ("stuck", "sending"),
    ("dead_letters", "dead"),
    ("lag", "ready"),
    ("lag", "waiting"),
    ("lag", "oldest_waiting_age_s"),
    ("lag", "lag_now_s"),
    ("stuck", "stuck"),
    ("blocked_keys", "blocked_keys"),
    ("blocked_keys", "blocked_messages"),
    ("lag", "paused_waiting"),
)


def worst_severity(verdicts: Iterable[CheckVerdict]) -> CheckSeverity:
    return max((v.severity for v in verdicts), key=_RANK.__getitem__, default=CheckSeverity.OK)


def table_health(verdicts: Iterable[CheckVerdict]) -> str:
    """``healthy``, ``warning`` or ``failing``: the table's worst check."""
    return HEALTH[worst_severity(verdicts)].value


def not_passing(verdicts: Iterable[CheckVerdict]) -> str:
    """The checks that do not pass, worst first: ``dead_letters error, lag warn``; empty when all pass."""
    failing = sorted(
        (v for v in verdicts if v.severity != CheckSeverity.OK), key=lambda v: (-_RANK[v.severity], v.name)
    )
    return ", ".join(f"{v.name} {v.severity}" for v in failing)


def _paused_topics(verdicts: list[CheckVerdict]) -> str | None:
    for verdict in verdicts:
        paused = verdict.metadata.get("paused_topics")
        if paused:
            return paused if isinstance(paused, str) else ", ".join(str(topic) for topic in paused)
    return None


def health_materialization(table_name: str, verdicts: list[CheckVerdict]) -> dg.AssetMaterialization:
    """The table's state as its checks saw it: ``health`` and the figures, and a link to the on-call page."""
    by_check = {v.name: v.metadata for v in verdicts}
    health = table_health(verdicts)
    problems = not_passing(verdicts)
    figures = {
        figure: by_check[check].get(figure)
        for check, figure in FIGURES
        if by_check.get(check, {}).get(figure) is not None
    }
    metadata: dict[str, Any] = {
        "health": dg.MetadataValue.text(health),
        "checks not passing": dg.MetadataValue.text(problems or "none"),
        **metadata_values(figures),
    }
    paused = _paused_topics(verdicts)
    if paused:
        metadata["paused_topics"] = dg.MetadataValue.text(paused)
    page = oncall_page_url(table_name)
    if page:
        metadata["on-call page"] = dg.MetadataValue.url(page)
    return dg.AssetMaterialization(
        asset_key=table_asset_key(table_name),
        description=f"{table_name} as its checks saw it: {health}" + (f" ({problems})" if problems else ""),
        metadata=metadata,
    )


def _when(row: MessageRow) -> str:
    return row.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _error(text: str | None) -> str | None:
    if text is None or len(text) <= ERROR_TEXT_CHARS:
        return text
    return text[: ERROR_TEXT_CHARS - 1] + "…"


MESSAGE_COLUMNS = (
    dg.TableColumn("event id", "string", description="the message's event_id"),
    dg.TableColumn("topic", "string"),
    dg.TableColumn("key", "string", description="its ordering key"),
    dg.TableColumn("tenant", "string"),
    dg.TableColumn("attempts", "int"),
    dg.TableColumn("error code", "string"),
    dg.TableColumn("error", "string", description="its last error (credentials masked)"),
    dg.TableColumn("time (UTC)", "string", description="when it died"),
)
BEHIND = dg.TableColumn("waiting behind", "int", description="later messages of its key held back")


def messages_table(rows: list[MessageRow], *, blocked: bool = False) -> dg.TableMetadataValue:
    """Rows as an inline table on a check's page, in the order given (newest first)."""
    columns = [*MESSAGE_COLUMNS, BEHIND] if blocked else list(MESSAGE_COLUMNS)
    records = [
        dg.TableRecord(
            {
                "event id": row.event_id,
                "topic": row.topic,
                "key": row.ordering_key,
                "tenant": row.tenant_id,
                "attempts": row.attempts,
                "error code": row.error_code,
                "error": _error(row.error),
                "time (UTC)": _when(row),
                **({"waiting behind": row.waiting_behind} if blocked else {}),
            }
        )
        for row in rows
    ]
    return dg.MetadataValue.table(records, schema=dg.TableSchema(columns=columns))


def message_rows_metadata(conn: Any, table_name: str, verdicts: list[CheckVerdict]) -> dict[str, dict[str, Any]]:
    """Per check, the metadata of its messages: ``dead_letters`` while the table has dead messages,
    ``blocked_keys`` while keys are blocked; nothing is read for a table with neither."""
    by_check = {v.name: v.metadata for v in verdicts}
    page = oncall_page_url(table_name)
    more = {"on-call page": dg.MetadataValue.url(page)} if page else {}
    found: dict[str, dict[str, Any]] = {}
    if by_check.get("dead_letters", {}).get("dead"):
        found["dead_letters"] = {"messages": messages_table(dead_messages(conn, table_name, MESSAGE_ROWS)), **more}
    if by_check.get("blocked_keys", {}).get("blocked_keys"):
        rows = blocked_messages(conn, table_name, MESSAGE_ROWS)
        found["blocked_keys"] = {"messages": messages_table(rows, blocked=True), **more}
    return found
