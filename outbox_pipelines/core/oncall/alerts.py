"""Alerts that on-call can trust: fired once when a condition starts, reminded rarely, resolved once.

A *condition* (a table's check, a relay, a run) has a key, a severity, a one-sentence summary, figures and a
link. What was last announced per key is kept in ``outbox_alert_state``, so each change is told once whichever
process evaluates it. Payloads are JSON with a Slack-compatible ``text``.
"""

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, Protocol

import psycopg

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.models import CheckSeverity
from outbox_pipelines.core.redaction import (
    hide_url_paths_in_http_client_logs,
    redact_text,
    split_credentials,
    unencoded_userinfo,
    url_origin,
)
from outbox_pipelines.core.settings import parse_duration
from outbox_pipelines.core.storage.table import SharedTables

log = logging.getLogger("outbox_pipelines.alerts")

ALERT_WEBHOOK_ENV = "OUTBOX_ALERT_WEBHOOK_URL"
ALERT_REPEAT_ENV = "OUTBOX_ALERT_REPEAT"
DEFAULT_REPEAT_S = 30 * 60.0


# "info": a note nobody has to act on (a launch refused for its input, told to whoever launched it); only ever
# a one-off event (announce_event), never a condition that fires and resolves.
class AlertSeverity(StrEnum):
    """How loud an alert is: ``ok`` (nothing wrong, or resolved), ``info``, ``warning``, ``error``."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


Action = Literal["firing", "reminder", "resolved"]
_RANK = {AlertSeverity.OK: 0, AlertSeverity.INFO: 1, AlertSeverity.WARNING: 2, AlertSeverity.ERROR: 3}
# A check's grade as an alert's severity.
_OF_CHECK = {
    CheckSeverity.OK: AlertSeverity.OK,
    CheckSeverity.WARN: AlertSeverity.WARNING,
    CheckSeverity.ERROR: AlertSeverity.ERROR,
}


def alert_severity(grade: CheckSeverity) -> AlertSeverity:
    """The severity of the alert a check's grade raises ("warn" is a "warning")."""
    return _OF_CHECK[grade]


def repeat_every_s() -> float:
    raw = os.environ.get(ALERT_REPEAT_ENV)
    return parse_duration(raw, ALERT_REPEAT_ENV) if raw else DEFAULT_REPEAT_S


class Links(Protocol):
    """Where an alert sends people: the page of the UI that shows what it is about. The engine knows no UI; the
    Dagster layer gives its pages (defs/links.py), and a sweep without one sends alerts without a link."""

    label: str  # the link's words in an alert's text

    def table(self, table_name: str, check: str | None = None) -> str: ...

    def run(self, run_id: str) -> str: ...

    def settings(self) -> str: ...


class NoLinks:
    label = ""

    def table(self, table_name: str, check: str | None = None) -> str:
        return ""

    def run(self, run_id: str) -> str:
        return ""

    def settings(self) -> str:
        return ""


NO_LINKS = NoLinks()


@dataclass(frozen=True)
class Condition:
    key: str
    severity: AlertSeverity
    summary: str
    kind: str  # check | relay_died | run_failure | settings | undeclared_table
    link: str  # "" when the sweep was given no UI (Links)
    table: str | None = None
    check: str | None = None
    job: str | None = None
    run_id: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    link_label: str = ""
    # The key of the condition whose alert tells this one's cause (a table's lag and backlog follow from its
    # destination's outage): while that one is not ok, this one is not announced (one cause, one alert); if it
    # outlasts its cause, it is announced then.
    held_by: str | None = None


@dataclass(frozen=True)
class Memory:
    """What was last announced about a condition."""

    severity: AlertSeverity = AlertSeverity.OK
    started_at: datetime | None = None
    notified_at: datetime | None = None
    summary: str | None = None


def decide(previous: Memory, current: Condition, now: datetime, repeat_s: float) -> tuple[Action | None, Memory]:
    """What to announce, and what to remember. Pure: the whole alert policy is here."""
    if current.severity == AlertSeverity.OK:
        if previous.severity == AlertSeverity.OK:
            return None, previous
        return "resolved", Memory(AlertSeverity.OK, previous.started_at, now, current.summary)
    if previous.severity == AlertSeverity.OK:
        return "firing", Memory(current.severity, now, now, current.summary)
    if _RANK[current.severity] > _RANK[previous.severity]:
        return "firing", Memory(current.severity, previous.started_at, now, current.summary)
    if previous.notified_at is None or now - previous.notified_at >= timedelta(seconds=repeat_s):
        return "reminder", Memory(current.severity, previous.started_at, now, current.summary)
    # Still on, or eased from error to warning: say nothing, remember the milder state
    # (a return to error is then announced again).
    return None, replace(previous, severity=current.severity)


def payload(
    action: Action, condition: Condition, severity: AlertSeverity, started_at: datetime | None, now: datetime
) -> dict[str, Any]:
    """The JSON on-call receives (``severity``: of the alert, also when it resolves). No internal tags, no secrets."""
    lasted = f" after {duration_words((now - started_at).total_seconds())}" if started_at and action != "firing" else ""
    summary = redact_text(condition.summary)
    head = {"firing": "FIRING", "reminder": "STILL FIRING", "resolved": "RESOLVED"}[action]
    if severity == AlertSeverity.INFO:
        head = "NOTE"  # nothing fires: a note is told once and has nothing to resolve
    text = f"*{head}*{lasted} [{severity}] {summary}"
    if condition.link:
        text += f"\n<{condition.link}|{condition.link_label or 'Open'}>"
    body: dict[str, Any] = {
        "status": "resolved" if action == "resolved" else "firing",
        "reminder": action == "reminder",
        "severity": severity,
        "kind": condition.kind,
        "alert_key": condition.key,
        "table": condition.table,
        "summary": summary,
        "figures": {k: (redact_text(v) if isinstance(v, str) else v) for k, v in condition.figures.items()},
        "started_at": (started_at or now).isoformat(),
        "link": condition.link,
        "text": text,
        "sent_at": now.isoformat(),
    }
    if action == "resolved":
        body["resolved_at"] = now.isoformat()
    for name in ("check", "job", "run_id"):
        value = getattr(condition, name)
        if value is not None:
            body[name] = value
    return body


def post_alert(body: dict[str, Any], url: str | None = None, timeout_s: float = 5.0) -> bool:
    """Post one alert; True if the webhook accepted it (2xx). Logged either way; never raises."""
    url = url if url is not None else os.environ.get(ALERT_WEBHOOK_ENV)
    log.warning("outbox alert: %s", body.get("text", body.get("summary", "")))
    if not url:
        return False
    two_ways = unencoded_userinfo(url, ALERT_WEBHOOK_ENV)  # httpx would post to a host read out of the password
    if two_ways is not None:
        log.error("alert not posted: %s", two_ways)
        return False
    # Only the origin is shown: a webhook's path (Slack's /services/T/B/X) is its secret. Credentials travel as
    # Basic auth, never in the URL, and httpx's own request log shows the origin only.
    shown = url_origin(url)
    import httpx  # here: a relay or a command that posts no alert starts without the HTTP stack

    hide_url_paths_in_http_client_logs()
    bare, auth = split_credentials(url)
    try:
        response = httpx.post(bare, json=body, timeout=timeout_s, auth=auth)
    except httpx.HTTPError as exc:
        log.error("alert webhook %s unreachable: %s", shown, redact_text(str(exc)))
        return False
    if response.status_code >= 300:
        log.error("alert webhook %s answered HTTP %s", shown, response.status_code)
        return False
    return True


def _read(shared: SharedTables, keys: Sequence[str]) -> dict[str, Memory]:
    return {
        row["alert_key"]: Memory(AlertSeverity(row["severity"]), row["started_at"], row["notified_at"], row["summary"])
        for row in shared.read_alert_states(keys)
    }


def _remember(shared: SharedTables, key: str, memory: Memory) -> None:
    shared.write_alert_state(
        key=key,
        severity=memory.severity,
        started_at=memory.started_at,
        notified_at=memory.notified_at,
        summary=redact_text(memory.summary or "")[:2000],
    )


def announce(
    conn: psycopg.Connection,
    conditions: Iterable[Condition],
    *,
    now: datetime | None = None,
    repeat_s: float | None = None,
    webhook_url: str | None = None,
) -> list[dict[str, Any]]:
    """Apply the policy to the current conditions, post what must be told, remember it; return the payloads.
    A condition ``held_by`` another that is not ok is left unsaid (its cause's alert tells it).

    A state is remembered only once its alert was accepted (or no webhook is set), so an
    alert the webhook refused is tried again on the next evaluation instead of being lost.
    """
    conditions = list(conditions)
    if not conditions:
        return []
    shared = SharedTables(conn)
    now = now or shared.database_now()
    repeat_s = repeat_every_s() if repeat_s is None else repeat_s
    url = webhook_url if webhook_url is not None else os.environ.get(ALERT_WEBHOOK_ENV)
    memories = _read(shared, [c.key for c in conditions])
    severity_of = {c.key: c.severity for c in conditions}
    sent = []
    for condition in conditions:
        if (
            condition.held_by
            and condition.severity != AlertSeverity.OK
            and severity_of.get(condition.held_by, AlertSeverity.OK) != AlertSeverity.OK
        ):
            continue  # its cause's alert tells it; nothing remembered, so it fires if it outlasts the cause
        previous = memories.get(condition.key, Memory())
        action, memory = decide(previous, condition, now, repeat_s)
        if action is not None:
            shown: AlertSeverity = previous.severity if action == "resolved" else condition.severity
            body = payload(action, condition, shown, memory.started_at, now)
            if not post_alert(body, url) and url:
                continue  # not delivered: keep the old memory, try again next time
            sent.append(body)
        if memory != previous:
            _remember(shared, condition.key, memory)
    return sent


def announce_event(condition: Condition, *, now: datetime, webhook_url: str | None = None) -> dict[str, Any]:
    """A one-off event (a relay died, a run failed): told once, nothing to resolve."""
    body = payload("firing", condition, condition.severity, now, now)
    post_alert(body, webhook_url)
    return body
