"""A table's state as the checks and ``status`` read it: rows in each state, how late, how many dead and why,
the destination's health; at a bounded cost whatever the table holds."""

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from outbox_pipelines.core.models import STATES, MessageState
from outbox_pipelines.core.oncall.lock_holders import held_long
from outbox_pipelines.core.relay.destination_health import DestinationHealth, read_health
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.paused_topics import paused_topics
from outbox_pipelines.core.storage.shared_tables import SharedTables
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.core.storage.table_owners import owners

LAG_WINDOW_S = 3600.0
# Lag percentiles come from at most this many of the newest deliveries and of the oldest
# waiting messages: the checks cost the same with 1,000 or 10,000,000 sent rows kept.
LAG_SAMPLE = 5000


@dataclass
class TableStatus:
    table: str
    counts: dict[str, int] = field(default_factory=dict)
    ready: int = 0
    # Age of the oldest message not yet delivered (pending, retrying in backoff, or in flight).
    oldest_waiting_age_s: float | None = None
    next_due_in_s: float | None = None
    stuck: int = 0
    lag_window_s: float = LAG_WINDOW_S
    lag_sample: int = 0
    # created → delivered over the window's deliveries, and created → now for messages still waiting
    # (the metrics' and `status`'s delivery lag; the lag check grades lag_now below).
    lag_p50_s: float | None = None
    lag_p95_s: float | None = None
    lag_p99_s: float | None = None
    # What waits now: messages due and not delivered (pending and due, not held behind an earlier message
    # of their key; or in flight), each timed from when it became due (a retry at its backoff's end, a
    # replay at the replay). lag_now_s: the oldest of them; lag_now_p95_s: the p95 over at most
    # LAG_SAMPLE of the oldest. Both 0 when nothing waits.
    waiting_now: int = 0
    lag_now_s: float = 0.0
    lag_now_p95_s: float = 0.0
    dead_by_code: dict[str, int] = field(default_factory=dict)
    destination: DestinationHealth | None = None
    # Ordering keys whose head is dead and parked: their later messages (blocked_messages) wait for an
    # operator (replay the head, or skip it). blocked_since: when the first of them died; blocked_oldest:
    # the first few, oldest first ({"key", "id", "died_at"}).
    blocked_keys: int = 0
    blocked_messages: int = 0
    blocked_since: datetime | None = None
    blocked_oldest: list[dict[str, Any]] = field(default_factory=list)
    # Sessions holding the table's ordering locks for long (oncall/lock_holders.py): LockHolder's fields.
    lock_holders: list[dict[str, Any]] = field(default_factory=list)
    # Paused on purpose (not lag): the topics paused ({"topic", "by", "since"}: the table's paused_topics, or
    # its handlers' switch as its relay recorded it) and the pending messages they hold; relay_enabled false
    # pauses the whole table.
    paused_topics: list[dict[str, Any]] = field(default_factory=list)
    paused_waiting: int = 0
    paused_oldest_s: float | None = None
    relay_enabled: bool = True

    @property
    def backlog(self) -> int:
        return self.counts.get(MessageState.PENDING, 0) + self.counts.get(MessageState.RETRYING, 0)

    @property
    def waiting(self) -> int:
        """Not yet delivered: backlog plus in flight."""
        return self.backlog + self.counts.get(MessageState.SENDING, 0)

    @property
    def oldest_pending_age_s(self) -> float | None:
        return self.oldest_waiting_age_s

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["backlog"] = self.backlog
        data["waiting"] = self.waiting
        data["oldest_pending_age_s"] = self.oldest_waiting_age_s
        data["blocked_since"] = self.blocked_since.isoformat() if self.blocked_since else None
        return data


def read_status(
    outbox_table: OutboxTable,
    *,
    stuck_after_s: float = 600.0,
    window_s: float = LAG_WINDOW_S,
    now: datetime | None = None,
    count_sent: bool = False,
    paused_topics: Sequence[dict[str, Any]] = (),
) -> TableStatus:
    """A table's health at a bounded cost; ``count_sent`` adds the exact sent count (a full scan).
    ``paused_topics`` ({"topic", "by", "since"}): their pending messages are counted aside, not as lag."""
    snap = outbox_table.health_snapshot(
        stuck_after_s=stuck_after_s,
        window_s=window_s,
        sample=LAG_SAMPLE,
        now=now,
        paused_topics=[p["topic"] for p in paused_topics],
    )
    status = TableStatus(outbox_table.table_name, lag_window_s=window_s)
    # Every state the snapshot counts; sent rows only when asked (a full scan).
    status.counts = {state: int(snap[state]) if state != MessageState.SENT else 0 for state in STATES}
    if count_sent:
        status.counts[MessageState.SENT] = outbox_table.sent_count()
    status.ready = int(snap["ready"])
    status.oldest_waiting_age_s = snap["oldest_waiting_age_s"]
    status.next_due_in_s = snap["next_due_in_s"]
    status.stuck = int(snap["stuck"])
    status.lag_sample = int(snap["lag_sample"])
    status.lag_p50_s, status.lag_p95_s, status.lag_p99_s = snap["lag_p50"], snap["lag_p95"], snap["lag_p99"]
    status.waiting_now = int(snap["waiting_now"])
    status.lag_now_s, status.lag_now_p95_s = float(snap["lag_now_s"]), float(snap["lag_now_p95_s"])
    dead_by_code = (snap["dead_by_code"] or {}).items()
    status.dead_by_code = {code: int(n) for code, n in sorted(dead_by_code, key=lambda kv: -int(kv[1]))}
    status.blocked_keys, status.blocked_messages = int(snap["blocked_keys"]), int(snap["blocked_messages"])
    status.blocked_since = snap["blocked_since"]
    status.blocked_oldest = list(snap["blocked_oldest"] or [])
    status.destination = read_health(outbox_table.conn, outbox_table.table_name, now=now)
    status.lock_holders = [asdict(h) for h in held_long(outbox_table.conn, outbox_table.table_name, now=now)]
    status.paused_topics = list(paused_topics)
    status.paused_waiting, status.paused_oldest_s = int(snap["paused_waiting"]), snap["paused_oldest_s"]
    return status


def read_table_status(
    conn: psycopg.Connection, table: TableSettings, *, now: datetime | None = None, count_sent: bool = False
) -> TableStatus:
    """A declared table's status with what its settings add: its paused topics (its settings' and those its
    relay recorded its handlers pausing: core/storage/paused_topics.py), left out of lag; whether relaying is on."""
    status = read_status(
        OutboxTable(conn, table.name),
        now=now,
        stuck_after_s=table.stuck_threshold_s,
        count_sent=count_sent,
        paused_topics=paused_topics(conn, table.name, table.paused_topics),
    )
    status.relay_enabled = table.relay_enabled
    return status


def ready_count(conn: psycopg.Connection, table_name: str, paused_topics: tuple[str, ...] = ()) -> int:
    return OutboxTable(conn, table_name).ready_count(paused_topics)


def undeclared_tables(
    conn: psycopg.Connection, declared: Iterable[str], project: str | None = None
) -> list[TableStatus]:
    """The outbox tables in the database that ``declared`` does not name (a removed section's, a typo's twin, one
    nobody declared): no relay of this project delivers their messages. Each with its status: what waits there.
    With ``project``, a table another project owns (core/storage/table_owners.py) is that project's, not listed."""
    known = set(declared)
    names = [name for name in SharedTables(conn).outbox_table_names() if name not in known]
    if project is not None:
        elsewhere = {name for name, owner in owners(conn, names).items() if owner.project != project}
        names = [name for name in names if name not in elsewhere]
    return [read_status(OutboxTable(conn, name)) for name in sorted(names)]
