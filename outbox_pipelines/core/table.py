"""The relay-side operations on one outbox table, each one SQL statement."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.queries import table_query


def unknown_table(table: str) -> UnknownTable:
    return UnknownTable(
        f"outbox table {table!r} does not exist: run 'outbox-pipelines db upgrade', "
        f"or 'outbox-pipelines db create-table {table}' for a new table"
    )


@dataclass(frozen=True)
class Settlement:
    """How one claimed row ends: new status ('sent', 'deleted', 'pending', 'dead')."""

    id: int
    attempts: int
    status: str
    audit_code: str
    delay_s: float = 0.0
    error_code: str | None = None
    error: str | None = None
    ref: str | None = None
    # Give back the attempt counted at claim (throttling, or the circuit was open): not the message's fault.
    refund: bool = False


class OutboxTable:
    """Claim, settle and maintain one outbox table through one psycopg connection.

    ``now`` parameters exist for tests that move database time; production
    passes None and every comparison uses the server's ``now()``.
    """

    def __init__(self, conn: psycopg.Connection, table: str) -> None:
        self.conn = conn
        self.table = validate_table_name(table)

    def _run(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            try:
                cur.execute(table_query(query, self.table), {"table_name": self.table, **params})
            except psycopg.errors.UndefinedTable:
                raise unknown_table(self.table) from None
            return cur.fetchall() if cur.description else []

    def claim(
        self,
        worker: str,
        limit: int,
        lease_s: float,
        *,
        paused_topics: Sequence[str] = (),
        max_attempts: int = 2**31 - 1,
        now: datetime | None = None,
    ) -> list[ClaimedMessage]:
        """Due pending rows, and sending rows whose lease expired (re-taken, fenced by the attempt number)."""
        rows = self._run(
            "outbox_claim",
            {"worker": worker, "limit": limit, "lease_s": lease_s, "paused_topics": list(paused_topics),
             "max_attempts": max_attempts, "now": now},
        )
        return [ClaimedMessage(**row) for row in rows]

    def settle(self, worker: str, settlements: Sequence[Settlement], *, now: datetime | None = None) -> set[int]:
        """Apply the outcomes; return the ids settled. Missing ids lost their lease (audited)."""
        if not settlements:
            return set()
        kept = [s for s in settlements if s.status != "deleted"]
        gone = [s for s in settlements if s.status == "deleted"]
        rows = self._run(
            "outbox_settle",
            {
                "worker": worker,
                "now": now,
                "ids": [s.id for s in kept],
                "attempts": [s.attempts for s in kept],
                "statuses": [s.status for s in kept],
                "delays": [s.delay_s for s in kept],
                "error_codes": [s.error_code for s in kept],
                "errors": [s.error for s in kept],
                "refs": [s.ref for s in kept],
                "audit_codes": [s.audit_code for s in kept],
                "refunds": [s.refund for s in kept],
                "delete_ids": [s.id for s in gone],
                "delete_attempts": [s.attempts for s in gone],
                "delete_audit_codes": [s.audit_code for s in gone],
                "delete_error_codes": [s.error_code for s in gone],
            },
        )
        return {row["id"] for row in rows}

    def renew(
        self, worker: str, held: Sequence[tuple[int, int]], lease_s: float, *, now: datetime | None = None
    ) -> set[int]:
        """Extend the leases of (id, attempts) pairs this worker holds; return the ids renewed."""
        if not held:
            return set()
        rows = self._run(
            "outbox_renew_leases",
            {
                "worker": worker,
                "lease_s": lease_s,
                "now": now,
                "ids": [h[0] for h in held],
                "attempts": [h[1] for h in held],
            },
        )
        return {row["id"] for row in rows}

    def release_unsent(self, worker: str, held: Sequence[tuple[int, int]], reason: str) -> set[int]:
        """Give claimed-but-unsent rows back (attempt not counted); return the ids released."""
        if not held:
            return set()
        rows = self._run("outbox_release_unsent", {"worker": worker, "reason": reason,
                                                   "ids": [h[0] for h in held], "attempts": [h[1] for h in held]})
        return {row["id"] for row in rows}

    def dedup_lookup(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """Sent rows with the same (topic, payload_sha), keyed by that pair."""
        if not keys:
            return {}
        rows = self._run(
            "outbox_dedup_lookup", {"topics": [k[0] for k in keys], "payload_shas": [k[1] for k in keys]}
        )
        return {(row["topic"], row["payload_sha"]): row for row in rows}

    def requeue_stuck(
        self,
        worker: str,
        *,
        stuck_after_s: float,
        max_attempts: int,
        limit: int = 1000,
        dead_holder: str | None = None,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Return expired or stuck leases to pending (dead when out of attempts); ``dead_holder``
        also returns every row that relay holds, lease or not (it is known to be dead)."""
        return self._run(
            "outbox_requeue_stuck",
            {
                "worker": worker,
                "dead_holder": dead_holder,
                "stuck_after_s": stuck_after_s,
                "max_attempts": max_attempts,
                "limit": limit,
                "now": now,
            },
        )

    def clean_sent(self, worker: str, *, retention_s: float, limit: int, tenant_id: str | None = None,
                   now: datetime | None = None) -> int:
        rows = self._run("outbox_clean_sent", {"worker": worker, "retention_s": retention_s, "limit": limit,
                                               "tenant_id": tenant_id, "now": now})
        return int(rows[0]["deleted"]) if rows else 0

    def replay_dead(self, worker: str, **params: Any) -> list[dict[str, Any]]:
        return self._run("outbox_replay_dead", {"worker": worker, **params})

    def next_due_in_s(self) -> float | None:
        rows = self._run("outbox_next_due_in", {})
        return rows[0]["next_due_in_s"] if rows else None

    def status_rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        return self._run(query, params)

    def retry_destination_failures_now(self, codes: Sequence[str]) -> int:
        """Make messages waiting out a backoff for these error codes due now; how many."""
        return int(self._run("outbox_retry_destination_failures_now", {"codes": list(codes)})[0]["pulled"])

    def held_by(self, worker: str) -> int:
        """How many rows ``worker`` holds in sending."""
        return int(self._run("outbox_held_by", {"worker": worker})[0]["held"])

    def health_snapshot(self, *, stuck_after_s: float, window_s: float, sample: int,
                        now: datetime | None = None) -> dict[str, Any]:
        """What the checks read, at a cost bounded by ``sample`` however many sent rows are kept."""
        return self._run("outbox_health_snapshot", {"stuck_after_s": stuck_after_s, "window_s": window_s,
                                                    "sample": sample, "now": now})[0]
