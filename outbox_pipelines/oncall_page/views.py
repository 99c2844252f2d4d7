"""The on-call page's pages: the tables, one table's dead and blocked messages, a search, an action's launch
and its run (a dry run's result, then the form that runs it for real)."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from outbox_pipelines.core.errors import ConfigError, UnknownTable
from outbox_pipelines.core.models import TableHealth
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.settings import Settings
from outbox_pipelines.core.settings.values import free_text
from outbox_pipelines.oncall_page import html as h
from outbox_pipelines.oncall_page import reads
from outbox_pipelines.oncall_page.dagster_client import (
    JOBS,
    LAUNCHED_BY_TAG,
    REASON_TAG,
    DagsterClient,
    DagsterUnavailable,
    LaunchRefused,
    RunView,
)


def _same_origin(request: Request) -> bool:
    source = request.headers.get("origin") or request.headers.get("referer")
    host = request.headers.get("host")
    return bool(source and host and urlsplit(source).netloc == host)


def _now() -> datetime:
    return datetime.now(UTC)


class Pages:
    """The handlers, over one database and one Dagster UI; ``settings`` gives the project's at each request."""

    def __init__(self, url: str, settings: Callable[[], Settings], dagster: DagsterClient) -> None:
        self.url, self.settings, self.dagster = url, settings, dagster

    async def overview(self, request: Request) -> Response:
        now_settings = self.settings()
        lines = await run_in_threadpool(reads.overview, self.url, now_settings)
        counts = {
            k: sum(1 for line in lines if line.health == k)
            for k in (TableHealth.FAILING, TableHealth.WARNING, TableHealth.HEALTHY)
        }
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no table declared"
        problem = f'<p class="bad">{h.esc(now_settings.problem)}</p>' if now_settings.problem else ""
        runs = h.link(self.dagster.base + "/runs", "Dagster")
        body = (
            f"<h1>Outbox on-call</h1><p>{len(lines)} tables: {h.esc(summary)}. Health is each table's worst check "
            f"(the asset checks' and alerts' verdicts). Run history: {runs}.</p>"
            f"{problem}{h.overview_rows(lines, {line.name: self.dagster.table_url(line.name) for line in lines})}"
        )
        return HTMLResponse(h.page("Outbox on-call", body))

    async def table_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            detail = await run_in_threadpool(reads.table_detail, self.url, self.settings(), name)
        except UnknownTable as exc:
            return problem_page(404, "No such table", str(exc))
        now, line = _now(), detail.line
        problems = "".join(
            f"<li><b>{h.esc(check)}</b> ({h.esc(sev)}): <span class=err>{h.esc(text)}</span></li>"
            for check, sev, text in line.problems
        )
        body = (
            f"<h1>{h.esc(name)} {h.badge(line.health)}</h1>"
            f"<p>{h.link(self.dagster.table_url(name), 'Open its checks in Dagster')}</p>"
            + (f"<ul>{problems}</ul>" if problems else "<p class=muted>all checks pass</p>")
            + h.paused_section(line, now)
            + f"<h2>Blocked ordering keys ({line.blocked_keys:,}; {line.blocked_messages:,} messages waiting)</h2>"
            "<p class=muted>Each key waits for its dead head: replay it (the key goes on in order) or skip it (the "
            "rest of the key goes on without it).</p>"
            + h.message_rows(detail.blocked, now, blocked=True)
            + f"<h2>Dead messages ({line.counts.get('dead', 0):,}; the newest {len(detail.dead)})</h2>"
            + h.message_rows(detail.dead, now)
        )
        return HTMLResponse(h.page(f"{name} · outbox on-call", body))

    async def search(self, request: Request) -> Response:
        text = request.query_params.get("q", "")
        rows = await run_in_threadpool(reads.search, self.url, self.settings(), text) if text.strip() else []
        body = (
            f"<h1>Find “{h.esc(text)}”</h1><p class=muted>by event id, ordering key or tenant, in every declared "
            "table (a key's delivered messages are found by event id or tenant).</p>"
            + h.message_rows(rows, _now(), with_table=True)
        )
        return HTMLResponse(h.page("Find · outbox on-call", body))

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in JOBS:
            return problem_page(404, "No such action", f"{action!r}: the actions are replay and skip")
        if not _same_origin(request):
            return problem_page(403, "Refused", "an action is taken only from this page's own forms")
        form = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
        table, event_id, real = form.get("table", ""), form.get("event_id", ""), form.get("real") == "1"
        row = await run_in_threadpool(reads.dead_message, self.url, self.settings(), table, event_id)
        if row is None or (action == "skip" and row.ordering_key is None):
            what = "dead message" if action == "replay" else "dead message blocking an ordering key"
            return problem_page(
                404, "Nothing to do", f"{table} has no {what} with event id {event_id!r} (replayed or skipped since?)"
            )
        reason = form.get("reason", "").strip()
        if real:
            try:
                reason = free_text(reason, "the reason")
            except ConfigError as exc:
                return problem_page(400, "Refused", str(exc))
            if not reason:
                return problem_page(400, "A reason is needed", "say why, for the audit, then run it for real")
        # The reason goes where each job audits it (its config), and on the run (a tag Dagster's Runs list filters by).
        config: dict[str, Any] = {"table": table, "ids": [row.id], "dry_run": not real}
        if action == "replay":
            config["force"] = real and form.get("force") == "1"
            config["reason"] = reason if real else ""
        else:
            config["reason"] = reason or "dry run from the on-call page"
        tags = {LAUNCHED_BY_TAG: "oncall-page", **({REASON_TAG: reason} if real else {})}
        try:
            run_id = await run_in_threadpool(self.dagster.launch, action, config, tags)
        except DagsterUnavailable as exc:
            return problem_page(503, "Dagster does not answer", str(exc))
        except LaunchRefused as exc:
            return problem_page(400, "Dagster refused the launch", str(exc))
        query = urlencode({"action": action, "table": table, "event_id": event_id})
        return RedirectResponse(f"/runs/{run_id}?{query}", status_code=303)

    async def run_page(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        action, table = request.query_params.get("action", ""), request.query_params.get("table", "")
        event_id = request.query_params.get("event_id", "")
        try:
            view = await run_in_threadpool(self.dagster.run, run_id)
        except DagsterUnavailable as exc:
            return problem_page(503, "Dagster does not answer", str(exc))
        except LaunchRefused as exc:
            return problem_page(404, "No such run", str(exc))
        row = None
        if view.finished and view.dry_run and view.status == "SUCCESS" and action in JOBS:
            row = await run_in_threadpool(reads.dead_message, self.url, self.settings(), table, event_id)
        body = _run_body(view, self.dagster.run_url(run_id), action, table, event_id, row)
        return HTMLResponse(h.page(f"run {run_id[:8]} · outbox on-call", body, refresh_s=None if view.finished else 1))


def _run_body(view: RunView, run_url: str, action: str, table: str, event_id: str, row: Any) -> str:
    mode = "dry run" if view.dry_run else "real run" if view.dry_run is False else "run"
    done = "" if view.finished else " <span class=muted>(this page refreshes until it ends)</span>"
    parts = [
        f"<h1>{h.esc(action or 'run')} of {h.esc(event_id or '?')} in {h.esc(table or '?')}: {h.esc(mode)}, "
        f"{h.esc(view.status)}</h1>{done}",
        f"<p>{h.link(run_url, 'Open the run in Dagster')} (its logs and history stay there)</p>",
    ]
    if view.failures:
        parts.append("".join(f'<p class="bad">{h.esc(f)}</p>' for f in view.failures))
    if view.logged:
        parts.append("<h2>What it says</h2><ul>" + "".join(f"<li>{h.esc(line)}</li>" for line in view.logged) + "</ul>")
    if view.figures:
        parts.append(h.grid(["figure", "value"], [[h.esc(k), h.esc(v)] for k, v in view.figures.items()]))
    if view.rows:
        parts.append(f"<pre>{h.esc(redact_text(view.rows))}</pre>")
    if view.finished and view.dry_run and view.status == "SUCCESS":
        parts.append(_real_form(action, table, event_id, row))
    elif view.finished:
        parts.append(f"<p>{h.link(h.table_href(table), 'Back to ' + table)}</p>" if table else "")
    return "".join(parts)


def _real_form(action: str, table: str, event_id: str, row: Any) -> str:
    if row is None:
        return f'<p class="note">{h.esc(event_id)} is no longer dead in {h.esc(table)}: nothing left to do.</p>'
    force = ""
    if action == "replay" and (row.error_code or "").upper() == "BAD_REQUEST":
        force = (
            '<p><label><input type="checkbox" name="force" value="1"> replay it though it died of BAD_REQUEST '
            "(invalid input: it will likely fail the same way unless the cause is fixed)</label></p>"
        )
    return (
        f'<h2>Run it for real</h2><form method="post" action="/actions/{h.esc(action)}">'
        f'<input type="hidden" name="table" value="{h.esc(table)}">'
        f'<input type="hidden" name="event_id" value="{h.esc(event_id)}"><input type="hidden" name="real" value="1">'
        f'<p><label>Why (kept with the run and in the audit): <input type="text" name="reason" required '
        f'maxlength="500"></label></p>{force}<button>Run it for real</button></form>'
    )


def problem_page(status: int, title: str, text: str) -> HTMLResponse:
    return HTMLResponse(h.page(title, f'<h1>{h.esc(title)}</h1><p class="bad">{h.esc(text)}</p>'), status)
