"""The Dagster UI's pages an alert points at (core/oncall/alerts.py's ``Links``): a table's asset checks, a run,
the code locations. The UI's address is ``OUTBOX_UI_URL`` (default: ``dagster dev``'s http://127.0.0.1:3000).

The on-call page (the operator page served next to the UI: dead and blocked messages, find a message, replay
or skip it) is at ``OUTBOX_ONCALL_URL``; unset, nothing links to it."""

import os
from urllib.parse import quote

UI_URL_ENV = "OUTBOX_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:3000"
ONCALL_URL_ENV = "OUTBOX_ONCALL_URL"


def ui_url() -> str:
    return (os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")


def oncall_page_url(table: str | None = None) -> str | None:
    """The on-call page (``OUTBOX_ONCALL_URL``): ``table``'s own page (``/tables/NAME``: its dead and blocked
    messages), else the list of tables; None while the variable is unset (no on-call page is served)."""
    base = (os.environ.get(ONCALL_URL_ENV) or "").strip().rstrip("/")
    if not base:
        return None
    return f"{base}/tables/{quote(table)}" if table else f"{base}/"


class DagsterLinks:
    label = "Open in Dagster"

    def __init__(self, base: str | None = None) -> None:
        self.base = (base or ui_url()).rstrip("/")

    def table(self, table_name: str, check: str | None = None) -> str:
        """The table's Checks tab; with ``check``, opened on that check (the UI opens on the first by name else)."""
        detail = f"&checkDetail={quote(check)}" if check else ""
        return f"{self.base}/assets/outbox/{quote(table_name)}?view=checks{detail}"

    def run(self, run_id: str) -> str:
        return f"{self.base}/runs/{quote(run_id)}"

    def settings(self) -> str:
        return f"{self.base}/locations"

    def oncall(self, table_name: str | None = None) -> str | None:
        """The on-call page on ``table_name`` (None without OUTBOX_ONCALL_URL): ``oncall_page_url``."""
        return oncall_page_url(table_name)
