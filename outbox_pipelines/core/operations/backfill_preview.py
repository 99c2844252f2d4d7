"""Backfill's dry run: what a backfill of a window would deliver again, and to where; nothing is changed.

Dagster's ``backfill_job`` runs it by default (``dry_run: true``): the messages sent in the window counted
per topic, and the first of them (id, event id, topic), as the real backfill would deliver them (by id).
"""

from dataclasses import dataclass, field
from datetime import datetime

from outbox_pipelines.core.storage.backfill_reads import BackfillReads
from outbox_pipelines.core.storage.db import connect

# Rows listed by their ids in a dry run; every row is counted.
FIRST_LIMIT = 20


@dataclass(frozen=True)
class FirstRow:
    id: int
    event_id: str
    topic: str
    published_at: datetime


@dataclass(frozen=True)
class BackfillPreview:
    table: str
    start: datetime
    end: datetime
    destination: str
    by_topic: dict[str, int] = field(default_factory=dict)
    first: list[FirstRow] = field(default_factory=list)

    @property
    def found(self) -> int:
        return sum(self.by_topic.values())

    @property
    def summary(self) -> str:
        window = f"[{self.start.isoformat()}, {self.end.isoformat()})"
        if not self.found:
            return f"dry run: {self.table} sent no message in {window}; a backfill would deliver nothing"
        topics = ", ".join(f"{topic} {count}" for topic, count in self.by_topic.items())
        return (
            f"dry run: would re-deliver {self.found} messages of {self.table} sent in {window} to "
            f"{self.destination} ({topics}); nothing was delivered or changed"
        )

    def rows_markdown(self) -> str:
        """The counts per topic and the first rows, as markdown tables."""
        lines = ["| topic | messages |", "| --- | ---: |"]
        lines += [f"| {_cell(topic)} | {count} |" for topic, count in self.by_topic.items()]
        if self.first:
            shown = f"the first {len(self.first)} of {self.found}" if self.found > len(self.first) else "all"
            lines += ["", f"Delivered in this order ({shown}):", "", "| id | event_id | topic | sent at |"]
            lines += ["| --- | --- | --- | --- |"]
            lines += [
                f"| {row.id} | {_cell(row.event_id)} | {_cell(row.topic)} | {row.published_at.isoformat()} |"
                for row in self.first
            ]
        return "\n".join(lines)


def _cell(text: str) -> str:
    """Text in a markdown table cell: a pipe or a line break would end the cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def preview_sent(
    url: str, table_name: str, start: datetime, end: datetime, *, destination: str, limit: int = FIRST_LIMIT
) -> BackfillPreview:
    """What ``redeliver_sent`` would deliver for [start, end): counted per topic, the first ``limit`` listed."""
    with connect(url) as conn:
        reads = BackfillReads(conn, table_name)
        by_topic = reads.sent_by_topic(start=start, end=end)
        first = [
            FirstRow(row["id"], row["event_id"], row["topic"], row["published_at"])
            for row in reads.first_sent(start=start, end=end, limit=limit)
        ]
    return BackfillPreview(table_name, start, end, destination, by_topic, first)
