"""The page's HTML: plain server-rendered markup, every value escaped (``esc``), no script and nothing fetched
from elsewhere (the machine may have no internet). A page refreshes itself only while a run it shows is going."""

from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.models import MessageState
from outbox_pipelines.core.oncall.message_rows import MessageRow
from outbox_pipelines.oncall_page.reads import SENT_CAP, TableLine

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 .3em}h2{font-size:16px;margin:1.4em 0 .4em}
a{color:#0b5cad}table{border-collapse:collapse;width:100%;margin:.4em 0}
th,td{border-bottom:1px solid #d8dee4;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
.failing{background:#c62828;color:#fff}.warning{background:#f9a825;color:#1b1f24}.healthy{background:#2e7d32;color:#fff}
.badge{display:inline-block;border-radius:3px;padding:1px 7px;font-weight:600;font-size:12px}
.err{font-family:ui-monospace,monospace;font-size:12px;max-width:42em;overflow-wrap:anywhere}
.muted{color:#57606a}.note{background:#fff8e1;border:1px solid #f9a825;padding:.6em .8em;margin:.6em 0}
.bad{background:#ffebee;border:1px solid #c62828;padding:.6em .8em;margin:.6em 0}
form.inline{display:inline;margin:0}button{font:inherit;padding:2px 10px;cursor:pointer}
pre{background:#f6f8fa;padding:.6em;overflow:auto;font-size:12px}nav{margin-bottom:1em}
input[type=text]{font:inherit;padding:2px 6px;min-width:24em}
"""


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, *, refresh_s: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{refresh}<title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head><body>'
        f'<nav><a href="/">All tables</a> · <form class="inline" action="/search" method="get">'
        f'<input type="text" name="q" placeholder="event id, ordering key or tenant" aria-label="search">'
        f" <button>Find</button></form></nav>{body}</body></html>"
    )


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def table_href(name: str) -> str:
    return f"/tables/{quote(name)}"


def badge(health: str) -> str:
    return f'<span class="badge {esc(health)}">{esc(health)}</span>'


def when(at: datetime, now: datetime) -> str:
    """'2026-05-01 10:00:00 UTC (3 min ago)'."""
    utc = at.astimezone(UTC)
    return f"{utc:%Y-%m-%d %H:%M:%S} UTC ({duration_words(max((now - at).total_seconds(), 0))} ago)"


def grid(headers: Iterable[str], rows: Iterable[Iterable[str]], numeric: Iterable[int] = ()) -> str:
    """A table of already escaped cells; ``numeric``: the columns aligned right."""
    right = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in right else ''}>{cell}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def overview_rows(lines: list[TableLine], dagster_url: dict[str, str]) -> str:
    def sent(line: TableLine) -> str:
        return f"≥ {SENT_CAP:,}" if line.sent >= SENT_CAP else f"{line.sent:,}"

    def wrong(line: TableLine) -> str:
        if not line.problems:
            return '<span class="muted">all checks pass</span>'
        name, _, text = line.problems[0]
        more = f' <span class="muted">(+{len(line.problems) - 1} more)</span>' if len(line.problems) > 1 else ""
        return f'<b>{esc(name)}</b>: <span class="err">{esc(text[:400])}</span>{more}'

    rows = []
    for line in lines:
        c = line.counts
        blocked = f"{line.blocked_keys:,} ({line.blocked_messages:,} waiting)" if line.blocked_keys else "0"
        rows.append(
            [
                badge(line.health),
                link(table_href(line.name), line.name),
                *(
                    ("–",) * 5
                    if line.missing
                    else (
                        f"{c.get('pending', 0):,}",
                        f"{c.get('retrying', 0):,}",
                        f"{c.get('sending', 0):,}",
                        esc(sent(line)),
                        f"{c.get('dead', 0):,}",
                    )
                ),
                esc(blocked),
                esc(paused_cell(line)),
                esc(duration_words(line.oldest_waiting_age_s)),
                wrong(line),
                link(dagster_url[line.name], "Dagster"),
            ]
        )
    headers = ["health", "table", "pending", "retrying", "sending", "sent", "dead", "blocked keys", "paused topics"]
    headers += ["oldest waiting", "what is wrong", ""]
    return grid(headers, rows, numeric=(2, 3, 4, 5, 6))


def paused_cell(line: TableLine) -> str:
    """'audit.exported (3 waiting)'; the whole table when its relay is off; '–' when nothing is paused."""
    if not line.relay_enabled:
        return "the whole table (relay_enabled = false)"
    if not line.paused_topics:
        return "–"
    waiting = f" ({line.paused_waiting:,} waiting)" if line.paused_waiting else ""
    return ", ".join(p["topic"] for p in line.paused_topics) + waiting


def _since(since: str | None, now: datetime) -> str:
    if not since:
        return "–"
    try:
        return when(datetime.fromisoformat(since), now)
    except ValueError:
        return since


def paused_section(line: TableLine, now: datetime) -> str:
    """A table's paused topics (which, by whom, since when) and what they hold; nothing when none is paused."""
    if line.relay_enabled and not line.paused_topics:
        return ""
    off = (
        "<p class=note>Relaying is off for the whole table (relay_enabled = false): its messages wait, nothing is "
        "lost.</p>"
        if not line.relay_enabled
        else ""
    )
    rows = [[esc(p["topic"]), esc(p.get("by") or "–"), esc(_since(p.get("since"), now))] for p in line.paused_topics]
    topics = grid(["topic", "paused by", "since"], rows) if rows else ""
    topics_n, waiting_n = len(line.paused_topics), line.paused_waiting
    counted = f"{topics_n:,} topic{'' if topics_n == 1 else 's'}; {waiting_n:,} message{'' if waiting_n == 1 else 's'}"
    return (
        f"<h2>Paused on purpose ({counted} waiting)</h2>"
        f"{off}<p class=muted>Their messages wait as pending, nothing is lost, and the wait is not lag. To resume a "
        "topic, take it out of the table's paused_topics, or switch it on in its handlers "
        "(HandlerRegistry.set_enabled).</p>"
        f"{topics}"
    )


def action_button(action: str, row: MessageRow, label: str) -> str:
    return (
        f'<form class="inline" method="post" action="/actions/{esc(action)}">'
        f'<input type="hidden" name="table" value="{esc(row.table)}">'
        f'<input type="hidden" name="event_id" value="{esc(row.event_id)}">'
        f'<button title="a dry run first: nothing changes until you confirm">{esc(label)}</button></form>'
    )


def message_rows(rows: list[MessageRow], now: datetime, *, with_table: bool = False, blocked: bool = False) -> str:
    """Dead, blocked or found messages, each dead one with its Replay… (and, for a key's blocking head, Skip…)."""
    if not rows:
        return '<p class="muted">none</p>'
    out = []
    for r in rows:
        actions = ""
        if r.status == MessageState.DEAD:
            actions = action_button("replay", r, "Replay…")
            if r.ordering_key is not None and (blocked or r.waiting_behind):
                actions += " " + action_button("skip", r, "Skip…")
        cells = [link(table_href(r.table), r.table)] if with_table else []
        cells += [esc(r.event_id), esc(r.status)] if with_table else [esc(r.event_id)]
        cells += [esc(r.topic), esc(r.ordering_key or "–")]
        cells += [f"{r.waiting_behind:,}"] if blocked else []
        cells += [esc(r.tenant_id or "–"), str(r.attempts), esc(r.error_code or "–")]
        cells += [f'<span class="err">{esc(r.error or "")}</span>', esc(when(r.at, now)), actions]
        out.append(cells)
    headers = ["table", "event id", "status"] if with_table else ["event id"]
    headers += ["topic", "ordering key"] + (["waiting behind"] if blocked else [])
    headers += ["tenant", "attempts", "error code", "error", "died / changed", ""]
    return grid(headers, out, numeric=(3,) if blocked else ())
