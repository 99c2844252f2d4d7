"""The database side of an outbox table's health: the vacuum check.

Per table, dead tuples against live rows and its bytes; for the database, the oldest thing holding vacuum back:
one verdict, ``vacuum``, told once for the database. Never the text of a statement (its literals may hold
secrets). Why a queue table lives on vacuum: docs/explanation/on-call.md, "The vacuum check".
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.models import CheckSeverity
from outbox_pipelines.core.oncall.alerts import NO_LINKS, Condition, Links, alert_severity
from outbox_pipelines.core.oncall.checks import CheckVerdict
from outbox_pipelines.core.settings import CheckThresholds, Settings
from outbox_pipelines.core.storage.queries import shared_query

CHECK = "vacuum"
CONDITION_KEY = "database:vacuum"
_RANK = {CheckSeverity.OK: 0, CheckSeverity.WARN: 1, CheckSeverity.ERROR: 2}


@dataclass(frozen=True)
class Holder:
    """The oldest thing holding vacuum back in the database."""

    kind: str  # "transaction" | "prepared transaction" | "replication slot"
    pid: int | None
    application: str | None
    state: str | None
    name: str | None  # a prepared transaction's gid, a slot's name
    xmin_age: int  # transactions since its horizon
    held_s: float | None  # None: a slot, or a session this login may not read

    def describe(self) -> str:
        """'a transaction open for 42 min (pid 1234, application 'report', idle in transaction)'."""
        if self.kind == "replication slot":
            return f"replication slot {_quoted(self.name)} ({self.state}, {_count(self.xmin_age)} transactions behind)"
        how_long = f" open for {duration_words(self.held_s)}" if self.held_s is not None else ""
        if self.kind == "prepared transaction":
            return f"prepared transaction {_quoted(self.name)}{how_long}"
        who = [f"pid {self.pid}", f"application {_quoted(self.application or '')}"]
        who += [self.state] if self.state else []
        return f"a transaction{how_long} ({', '.join(who)})"

    def remedy(self) -> str:
        """What ends the hold, as a statement to run."""
        if self.kind == "replication slot":
            return (
                "if its standby or subscriber is gone, drop it "
                f"(SELECT pg_drop_replication_slot({_literal(self.name)})); else end the standby's long query"
            )
        if self.kind == "prepared transaction":
            gid = _literal(self.name)
            return f"finish it (COMMIT PREPARED {gid} or ROLLBACK PREPARED {gid}, whichever its application meant)"
        return f"end it (SELECT pg_terminate_backend({self.pid})) or wait for it to finish"


@dataclass(frozen=True)
class TableVacuum:
    """An outbox table as vacuum sees it (pg_stat_user_tables, pg_class)."""

    table: str
    live: int
    dead: int
    table_bytes: int
    index_bytes: int
    last_vacuum_at: datetime | None


@dataclass(frozen=True)
class DatabaseHealth:
    now: datetime
    tables: dict[str, TableVacuum]
    holder: Holder | None


def read_database_health(
    conn: psycopg.Connection[Any], tables: list[str], *, now: datetime | None = None
) -> DatabaseHealth:
    """The tables' dead tuples and sizes, and the oldest holder of vacuum (one read each, whatever the tables
    hold). ``now``: the checks' clock (tests move it); None: the database's."""
    clock = _read(conn, "database_now", {})[0]["now"] if now is None else now
    stats = _read(conn, "vacuum_table_stats", {"tables": list(tables)})
    holders = _read(conn, "vacuum_horizon_holders", {"now": clock})
    return DatabaseHealth(
        clock,
        {
            row["table_name"]: TableVacuum(
                row["table_name"],
                max(int(row["live"]), 0),
                max(int(row["dead"]), 0),
                int(row["table_bytes"]),
                int(row["index_bytes"]),
                row["last_vacuum_at"],
            )
            for row in stats
        },
        Holder(**{**holders[0], "xmin_age": int(holders[0]["xmin_age"] or 0)}) if holders else None,
    )


def _read(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(query), params)
        return cur.fetchall()


def vacuum_verdict(health: DatabaseHealth, table: str, limits: CheckThresholds) -> CheckVerdict:
    """The ``vacuum`` check of one table: ERROR/WARN while something has held vacuum back for
    ``vacuum_held_error``/``_warn`` and the table holds ``dead_tuples_warn`` dead tuples; WARN while the table
    holds that many and ``dead_tuples_ratio_warn`` per live row, naming the holder when how long it has held is
    unknown (a replication slot; another role's session, to a login without pg_read_all_stats), else saying
    that autovacuum falls behind; OK otherwise, with the figures."""
    t = health.tables.get(table) or TableVacuum(table, 0, 0, 0, 0, None)
    holder = health.holder
    held_s = holder.held_s if holder is not None else None
    many = t.dead >= limits.dead_tuples_warn
    piling = many and t.dead >= limits.dead_tuples_ratio_warn * max(t.live, 1)
    figures = (
        f"{_count(t.dead)} dead tuples, {_share(t.dead, t.live)} of its {_count(t.live)} live rows"
        if t.live
        else f"{_count(t.dead)} dead tuples and no live row"
    )
    size = f"{_bytes(t.table_bytes + t.index_bytes)} with its indexes"
    severity = CheckSeverity.OK
    long_held = held_s is not None and held_s >= limits.vacuum_held_warn_s
    blamed = holder is not None and many and (long_held or (held_s is None and piling))
    if blamed and holder is not None:
        severity = (
            CheckSeverity.ERROR if held_s is not None and held_s >= limits.vacuum_held_error_s else CheckSeverity.WARN
        )
        text = (
            f"{table}: {holder.describe()} holds vacuum back: {figures} ({size}), and every claim walks over "
            f"them. {holder.remedy()[0].upper()}{holder.remedy()[1:]}; vacuum then removes them by itself."
        )
    elif piling:
        severity = CheckSeverity.WARN
        last = f"last vacuumed {_ago(health.now, t.last_vacuum_at)}" if t.last_vacuum_at else "never vacuumed"
        text = (
            f"{table}: vacuum is falling behind: {figures} (warn at {limits.dead_tuples_ratio_warn:g} per live row), "
            f"{last}; nothing has held it back for long. Run VACUUM (VERBOSE) {table}, and see whether autovacuum's "
            "workers are busy elsewhere (pg_stat_progress_vacuum); db upgrade gives the table its autovacuum "
            "settings (OUTBOX_AUTOVACUUM)."
        )
    else:
        per_row = f", {t.table_bytes // t.live:,} bytes a live row" if t.live else ""
        aside = f"; the oldest holder of vacuum is {holder.describe()}" if holder is not None and long_held else ""
        text = (
            f"{table}: {figures}; {size} (table {_bytes(t.table_bytes)}, indexes {_bytes(t.index_bytes)}"
            f"{per_row}){aside}."
        )
    return CheckVerdict(CHECK, severity, text, _metadata(t, holder, limits))


def _metadata(t: TableVacuum, holder: Holder | None, limits: CheckThresholds) -> dict[str, Any]:
    return {
        "live_rows": t.live,
        "dead_tuples": t.dead,
        "table_bytes": t.table_bytes,
        "index_bytes": t.index_bytes,
        "bytes_per_live_row": (t.table_bytes + t.index_bytes) // t.live if t.live else None,
        "holder": holder.describe() if holder else None,
        "holder_pid": holder.pid if holder else None,
        "holder_held_s": round(holder.held_s, 1) if holder and holder.held_s is not None else None,
        "holder_xmin_age": holder.xmin_age if holder else None,
        "vacuum_held_warn_s": limits.vacuum_held_warn_s,
        "vacuum_held_error_s": limits.vacuum_held_error_s,
        "dead_tuples_warn": limits.dead_tuples_warn,
        "dead_tuples_ratio_warn": limits.dead_tuples_ratio_warn,
    }


def vacuum_verdicts(
    conn: psycopg.Connection[Any], settings: Settings, tables: list[str], *, now: datetime | None = None
) -> dict[str, CheckVerdict]:
    """The ``vacuum`` check of each of ``tables``, graded by its own thresholds (defaults for a table whose
    section cannot be used)."""
    health = read_database_health(conn, tables, now=now)
    limits = {name: table.checks for name, table in settings.tables.items()}
    return {name: vacuum_verdict(health, name, limits.get(name, CheckThresholds())) for name in tables}


def vacuum_condition(verdicts: dict[str, CheckVerdict], links: Links = NO_LINKS) -> Condition:
    """One alert for the database: the worst table's sentence (one holder holds every table back), the others
    named. Fired once, reminded rarely, resolved once, by ``alerts.announce``."""
    ranked = sorted(verdicts.items(), key=lambda kv: (-_RANK[kv[1].severity], kv[0]))
    worst_table, worst = ranked[0] if ranked else ("", CheckVerdict(CHECK, CheckSeverity.OK, "no outbox table", {}))
    others = [name for name, verdict in ranked[1:] if verdict.severity != CheckSeverity.OK]
    summary = worst.description + (
        f" Also: {', '.join(others)}." if others and worst.severity != CheckSeverity.OK else ""
    )
    return Condition(
        key=CONDITION_KEY,
        severity=alert_severity(worst.severity),
        summary=summary if worst.severity != CheckSeverity.OK else "vacuum keeps up with every outbox table again",
        kind="database",
        link=links.table(worst_table, check=CHECK) if worst_table else "",
        link_label=links.label,
        table=worst_table or None,
        check=CHECK,
        figures={k: v for k, v in worst.metadata.items() if v is not None},
    )


def _count(n: int) -> str:
    if n < 1_000_000:
        return f"{n:,}"
    return f"{n / 1e6:.1f}M" if n < 1_000_000_000 else f"{n / 1e9:.1f}B"


def _share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f} %" if part < whole * 10 else f"{part / whole:.0f}×"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _ago(now: datetime, at: datetime) -> str:
    return f"{duration_words(max((now - at).total_seconds(), 0.0))} ago"


def _quoted(text: str | None) -> str:
    return "'" + (text or "").replace("'", "''") + "'"


_literal = _quoted
