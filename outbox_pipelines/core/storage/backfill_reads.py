"""The reads of a backfill's dry run: one outbox table's sent rows of a window, counted per topic and the
first of them (sql/queries/backfill.sql). Nothing is changed."""

from datetime import datetime

from outbox_pipelines.core.storage.statements import Row, TableStatements


class BackfillReads(TableStatements):
    """What a backfill of [start, end) would deliver again, through one psycopg connection."""

    def sent_by_topic(self, *, start: datetime, end: datetime) -> dict[str, int]:
        rows = self._run("outbox_backfill_topics", {"start": start, "end": end})
        return {row["topic"]: row["messages"] for row in rows}

    def first_sent(self, *, start: datetime, end: datetime, limit: int) -> list[Row]:
        return self._run("outbox_backfill_first", {"start": start, "end": end, "limit": limit})
