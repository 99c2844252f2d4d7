"""Maintenance of one outbox table: requeue stuck leases, pass over dead heads, the ordering sweep,
retention of sent rows, replay of dead rows and the pages a backfill delivers again."""

from collections.abc import Sequence
from datetime import datetime

from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.storage.statements import Row, TableStatements


class MaintenanceStatements(TableStatements):
    """Requeue, skip, sweep, clean, replay and backfill one outbox table."""

    def requeue_stuck(
        self,
        worker: str,
        *,
        stuck_after_s: float,
        max_attempts: int,
        limit: int = 1000,
        dead_holder: str | None = None,
        pass_over_dead: bool = False,
        now: datetime | None = None,
    ) -> list[Row]:
        """Return expired or stuck leases to pending (dead when out of attempts); ``dead_holder``
        also returns every row that relay holds, lease or not (it is known to be dead).
        ``pass_over_dead``: as for ``settle``."""
        rows = self._run(
            "outbox_requeue_stuck",
            {
                "worker": worker,
                "dead_holder": dead_holder,
                "stuck_after_s": stuck_after_s,
                "max_attempts": max_attempts,
                "limit": limit,
                "pass_over_dead": pass_over_dead,
                "now": now,
            },
        )
        if rows:
            self._note_contended(rows[0]["contended"])
        return rows

    def skip_dead_heads(
        self,
        worker: str,
        *,
        ids: Sequence[int] | None,
        ordering_key: str | None,
        reason: str,
        dry_run: bool,
        limit: int,
        now: datetime | None = None,
    ) -> list[Row]:
        """Pass over parked dead messages (by id, or every one of a key): their keys' later messages go on."""
        rows = self._run(
            "outbox_skip_dead_heads",
            {
                "worker": worker,
                "ids": list(ids) if ids is not None else None,
                "ordering_key": ordering_key,
                "reason": reason,
                "dry_run": dry_run,
                "limit": limit,
                "now": now,
            },
        )
        if rows:
            self._note_contended(rows[0]["contended"])
        return rows

    def unblock_sweep(self, *, after_key: str, limit: int) -> Row:
        """One page of the ordering sweep (sql: outbox_unblock_sweep): last_key (None at the end), released."""
        row = self._run("outbox_unblock_sweep", {"after_key": after_key, "limit": limit})[0]
        self._note_contended(row["contended"])
        return row

    def clean_sent(
        self, worker: str, *, retention_s: float, limit: int, tenant_id: str | None = None, now: datetime | None = None
    ) -> int:
        rows = self._run(
            "outbox_clean_sent",
            {"worker": worker, "retention_s": retention_s, "limit": limit, "tenant_id": tenant_id, "now": now},
        )
        return int(rows[0]["deleted"]) if rows else 0

    def clean_dead(self, worker: str, *, retention_s: float, limit: int, now: datetime | None = None) -> int:
        """One batch of dead rows older than ``retention_s``, never one that parks its ordering key."""
        rows = self._run(
            "outbox_clean_dead", {"worker": worker, "retention_s": retention_s, "limit": limit, "now": now}
        )
        return int(rows[0]["deleted"]) if rows else 0

    def replay_dead(
        self,
        worker: str,
        *,
        after_id: int,
        ids: Sequence[int] | None,
        topic: str | None,
        tenant_id: str | None,
        error_code: str | None,
        since: datetime | None,
        until: datetime | None,
        force: bool,
        dry_run: bool,
        limit: int,
        reason: str = "",
        now: datetime | None = None,
    ) -> list[Row]:
        """One page (ids above ``after_id``) of dead rows matching the filters (None = any), replayed
        unless ``dry_run``; BAD_REQUEST rows are refused unless ``force``. ``reason`` ('' = none) leads each
        audit row's detail, before the error the row died of."""
        return self._run(
            "outbox_replay_dead",
            {
                "worker": worker,
                "reason": reason,
                "after_id": after_id,
                "ids": list(ids) if ids is not None else None,
                "topic": topic,
                "tenant_id": tenant_id,
                "error_code": error_code,
                "since": since,
                "until": until,
                "force": force,
                "dry_run": dry_run,
                "limit": limit,
                "now": now,
            },
        )

    def sent_in_window(self, *, start: datetime, end: datetime, after_id: int, limit: int) -> list[ClaimedMessage]:
        """One page (ids above ``after_id``) of the rows sent in [start, end), as messages to deliver again."""
        rows = self._run("outbox_sent_in_window", {"start": start, "end": end, "after_id": after_id, "limit": limit})
        return [ClaimedMessage(**row) for row in rows]
