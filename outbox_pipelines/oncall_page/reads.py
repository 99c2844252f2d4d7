"""What the on-call page shows, read from the database: one line per declared table (counts per state, blocked
keys, paused topics, the oldest waiting message, its health by its worst check), a table's dead and blocked
messages, and a search across the tables. Figures and verdicts are the on-call room's (core/oncall): the same
functions ``status``, the asset checks and the on-call sensor use."""

from dataclasses import dataclass, field
from typing import Any

from outbox_pipelines.core.errors import InvalidTableName, UnknownTable
from outbox_pipelines.core.models import HEALTH_OF, SEVERITY_RANK, CheckSeverity, MessageState, TableHealth
from outbox_pipelines.core.oncall.checks import CheckVerdict
from outbox_pipelines.core.oncall.database_health import vacuum_verdicts
from outbox_pipelines.core.oncall.message_rows import (
    MessageRow,
    blocked_messages,
    dead_messages,
    find_messages,
    sent_count,
)
from outbox_pipelines.core.oncall.sweep import table_status_and_verdicts
from outbox_pipelines.core.settings import Settings
from outbox_pipelines.core.storage.db import connect

# Each check's grade as the page names a table's health; worst first.
HEALTH = HEALTH_OF
_RANK = {TableHealth.FAILING: 0, TableHealth.WARNING: 1, TableHealth.HEALTHY: 2}
# Sent rows are counted up to this many (a bounded read): more shows as "≥ 10,000".
SENT_CAP = 10_000


@dataclass
class TableLine:
    name: str
    health: TableHealth
    counts: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    blocked_keys: int = 0
    blocked_messages: int = 0
    # Paused on purpose ({"topic", "by", "since"}: core/storage/paused_topics.py) and the pending messages they hold;
    # relay_enabled false pauses the whole table.
    paused_topics: list[dict[str, Any]] = field(default_factory=list)
    paused_waiting: int = 0
    relay_enabled: bool = True
    oldest_waiting_age_s: float | None = None
    # The checks not passing, worst first: (check name, severity, its sentence).
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    missing: bool = False  # declared, not in the database

    @property
    def rank(self) -> tuple[int, str]:
        return (_RANK[self.health], self.name)


def _health(verdicts: list[CheckVerdict]) -> TableHealth:
    return HEALTH_OF[max((v.severity for v in verdicts), key=SEVERITY_RANK.__getitem__, default=CheckSeverity.OK)]


def _problems(verdicts: list[CheckVerdict]) -> list[tuple[str, str, str]]:
    failing = sorted((v for v in verdicts if not v.passed), key=lambda v: -SEVERITY_RANK[v.severity])
    return [(v.name, v.severity, v.description) for v in failing]


def declared_tables(settings: Settings) -> list[str]:
    """Every table the project declares, a usable section or not, in name order (what ``status`` and the
    sensor go through)."""
    return sorted({*settings.tables, *settings.broken})


def overview(url: str, settings: Settings) -> list[TableLine]:
    """One line per declared table, failing first, then warning, then healthy; each in name order."""
    with connect(url) as conn:
        names = declared_tables(settings)
        vacuum = vacuum_verdicts(conn, settings, names) if names else {}  # one read for every table
        lines = [_table_line(conn, settings, name, vacuum.get(name)) for name in names]
    return sorted(lines, key=lambda line: line.rank)


def _table_line(conn: Any, settings: Settings, name: str, vacuum: CheckVerdict | None = None) -> TableLine:
    line = TableLine(name, TableHealth.HEALTHY)
    try:
        # One read of the table: the figures shown and the sensor's and the asset checks' verdicts on them (and
        # the vacuum check's, read for every table at once).
        status, verdicts = table_status_and_verdicts(conn, settings, name)
    except (UnknownTable, InvalidTableName) as exc:
        line.health, line.missing = TableHealth.FAILING, True
        line.problems = [("table", CheckSeverity.ERROR, str(exc))]
        return line
    verdicts += [vacuum] if vacuum else []
    line.health, line.problems = _health(verdicts), _problems(verdicts)
    if status is None:
        line.missing = True  # a broken section naming a table not created: its verdicts say why
        return line
    line.sent = sent_count(conn, name, SENT_CAP)
    line.counts = dict(status.counts)
    line.blocked_keys, line.blocked_messages = status.blocked_keys, status.blocked_messages
    line.oldest_waiting_age_s = status.oldest_waiting_age_s
    line.paused_topics, line.paused_waiting = list(status.paused_topics), status.paused_waiting
    line.relay_enabled = status.relay_enabled
    return line


@dataclass
class TableDetail:
    name: str
    dead: list[MessageRow]
    blocked: list[MessageRow]
    line: TableLine


def table_detail(url: str, settings: Settings, name: str, limit: int = 50) -> TableDetail:
    """A declared table's dead messages and the dead heads blocking its keys, newest first. UnknownTable when
    the project does not declare ``name`` or the database lacks it."""
    if name not in declared_tables(settings):
        raise UnknownTable(f"{name!r} is not one of this project's tables")
    with connect(url) as conn:
        line = _table_line(conn, settings, name)
        if line.missing:
            return TableDetail(name, [], [], line)
        return TableDetail(name, dead_messages(conn, name, limit), blocked_messages(conn, name, limit), line)


def search(url: str, settings: Settings, text: str, limit: int = 50) -> list[MessageRow]:
    """Messages whose event id, ordering key or tenant is ``text``, in every declared table, newest first."""
    text = text.strip()
    if not text:
        return []
    tables = declared_tables(settings)
    found: dict[tuple[str, int], MessageRow] = {}
    with connect(url) as conn:
        for how in ("event_id", "ordering_key", "tenant_id"):
            for row in find_messages(conn, tables, limit=limit, **{how: text}):
                found.setdefault((row.table, row.id), row)
    rows = sorted(found.values(), key=lambda row: (row.at, row.id), reverse=True)
    return rows[:limit]


def dead_message(url: str, settings: Settings, table: str, event_id: str) -> MessageRow | None:
    """The dead message of a declared table with this event id (what an action names), or None."""
    if table not in declared_tables(settings):
        return None
    with connect(url) as conn:
        found = find_messages(conn, [table], event_id=event_id, limit=1)
    return found[0] if found and found[0].status == MessageState.DEAD else None
