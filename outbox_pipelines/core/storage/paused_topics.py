"""Topics paused on purpose: which, since when and by whom, as the checks, the alerts and ``status`` tell it.

Paused by the table's ``paused_topics`` or by its handlers (``HandlerRegistry.set_enabled(topic, False)``, recorded
by the relay); ``relay_enabled = false`` pauses the table. Their messages wait, and the wait is not lag: a pause
never pages as a late table.
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from outbox_pipelines.core.storage.shared_tables import SharedTables

BY_SETTINGS = "the table's settings (paused_topics)"
BY_HANDLERS = "its handlers (HandlerRegistry.set_enabled)"


def paused_topics(
    conn: psycopg.Connection, table_name: str, configured: Sequence[str] = (), *, recorded: bool = True
) -> list[dict[str, Any]]:
    """The table's paused topics, each {"topic", "by", "since"} ("since": ISO time, None when not known): those
    of its settings, then those its relay recorded its handlers pausing. A topic the relay recorded from
    settings that the settings no longer name is not paused any more (the relay records again when it runs)."""
    found: dict[str, dict[str, Any]] = {}
    seen = SharedTables(conn).read_paused_topics(table_name) if recorded else {}
    for topic in configured:
        since = (seen.get(topic) or {}).get("since")
        found[topic] = {"topic": topic, "by": BY_SETTINGS, "since": since}
    for topic, entry in sorted(seen.items()):
        if topic not in found and entry.get("by") != BY_SETTINGS:
            found[topic] = {"topic": topic, "by": entry.get("by") or BY_HANDLERS, "since": entry.get("since")}
    return list(found.values())


def _since(since: str | None) -> str:
    if not since:
        return ""
    try:
        return f" since {datetime.fromisoformat(since):%Y-%m-%d %H:%M} UTC"
    except ValueError:
        return f" since {since}"


def paused_text(paused: Sequence[dict[str, Any]]) -> str:
    """'orders.refund (the table's settings (paused_topics)), emails.welcome (its handlers ... since ...)'."""
    return ", ".join(f"{p['topic']} (by {p['by']}{_since(p.get('since'))})" for p in paused)


def paused_names(paused: Sequence[dict[str, Any]]) -> str | None:
    return ", ".join(p["topic"] for p in paused) or None
