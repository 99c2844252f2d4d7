"""The relay's single-active lock on one outbox table and the audit rows written about it: statements of
the shared tables, bound to this table."""

from collections.abc import Sequence

import psycopg

from outbox_pipelines.core.storage.statements import TableStatements


class LockAndAuditStatements(TableStatements):
    """The table's single-active session lock and its audit rows."""

    def try_relay_lock(self) -> bool:
        """Take the table's single-active session lock if nobody holds it."""
        rows = self._run_shared("outbox_relay_try_lock", {})
        return bool(rows and rows[0]["locked"])

    def wait_for_relay_lock(self, timeout_ms: int) -> bool:
        """Block up to ``timeout_ms`` on the single-active lock; True once held. Sets the session's
        lock_timeout: follow with ``reset_lock_timeout`` (in a ``finally``)."""
        try:
            self._run_shared("outbox_relay_wait_lock", {"timeout_ms": str(max(int(timeout_ms), 1))})
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    def reset_lock_timeout(self) -> None:
        """Let this session wait for locks as long as it needs again (after ``wait_for_relay_lock``)."""
        self._run_shared("outbox_relay_lock_timeout_reset", {})

    def release_relay_lock(self) -> bool:
        """Let go of the single-active lock; False if this session did not hold it."""
        rows = self._run_shared("outbox_relay_unlock", {})
        return bool(rows and rows[0]["unlocked"])

    def audit_messages(
        self, ids: Sequence[int], *, code: str, error_code: str | None, worker: str, detail: str | None
    ) -> None:
        """One audit row per message id; with no ids, one row about the table (message_id NULL)."""
        self._run_shared(
            "outbox_audit_insert",
            {"ids": list(ids) or [None], "code": code, "error_code": error_code, "worker": worker, "detail": detail},
        )

    def audit_note(self, *, code: str, worker: str, detail: str) -> None:
        """An audit row about the table as a whole (a backfill, say)."""
        self._run_shared("outbox_audit_note", {"code": code, "worker": worker, "detail": detail})
