"""What operators and the relay group read of outbox tables: a table's health and status figures, and
which tables have a message due now (one statement for all of them)."""

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from outbox_pipelines.core.names import table_identifier, validate_table_name
from outbox_pipelines.core.storage.queries import named_queries
from outbox_pipelines.core.storage.statements import Row, TableStatements


def ready_tables(conn: psycopg.Connection, paused_by_table: Mapping[str, Sequence[str]]) -> set[str]:
    """Which of these outbox tables have a pending row due now outside their paused topics: one statement
    for all of them (a relay group's poll for its quiet tables)."""
    if not paused_by_table:
        return set()
    parts = (_ready_probe(name, tuple(paused)) for name, paused in sorted(paused_by_table.items()))
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("\nUNION ALL\n".join(parts))  # each part composed by psycopg.sql from validated names
        return {row[0] for row in cur.fetchall()}


@lru_cache(maxsize=4096)
def _ready_probe(table_name: str, paused: tuple[str, ...]) -> str:
    """One table's part of ready_tables, rendered once (a group polls its quiet tables every second)."""
    probe = sql.SQL(named_queries()["outbox_ready_probe"]).format(
        table=table_identifier(validate_table_name(table_name)),
        name=sql.Literal(table_name),
        paused=sql.Literal(list(paused)),
    )
    return probe.as_string(None)


class StatusReads(TableStatements):
    """Health and status figures of one outbox table."""

    def health_snapshot(
        self,
        *,
        stuck_after_s: float,
        window_s: float,
        sample: int,
        now: datetime | None = None,
        paused_topics: Sequence[str] = (),
    ) -> Row:
        """What the checks read, at a cost bounded by ``sample`` however many sent rows are kept; the pending
        messages of ``paused_topics`` are counted aside, not as lag."""
        return self._run(
            "outbox_health_snapshot",
            {
                "stuck_after_s": stuck_after_s,
                "window_s": window_s,
                "sample": sample,
                "now": now,
                "paused_topics": list(paused_topics),
            },
        )[0]

    def sent_count(self) -> int:
        """The exact number of sent rows kept (a full scan of them)."""
        return int(self._run("outbox_status_sent_count", {})[0]["n"])

    def dead_counts_by_code(self) -> dict[str, int]:
        """Dead rows per error code ('UNKNOWN' for none), the commonest first."""
        return {row["error_code"]: int(row["n"]) for row in self._run("outbox_status_dead_by_code", {})}

    def ready_count(self, paused_topics: Sequence[str] = (), *, now: datetime | None = None) -> int:
        """Pending rows due now, outside the paused topics."""
        return int(self._run("outbox_ready_count", {"paused_topics": list(paused_topics), "now": now})[0]["ready"])

    def held_by(self, worker: str) -> int:
        """How many rows ``worker`` holds in sending."""
        return int(self._run("outbox_held_by", {"worker": worker})[0]["held"])
