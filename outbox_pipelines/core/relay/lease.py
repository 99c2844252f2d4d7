"""Seed 003's lease protocol as functions (``claim_outbox``, ``renew_lease``, ``ack_sent``, ``fail_retry``,
``mark_dead_by_worker``, ``check_dedup``), over the same fenced SQL the relay uses.

Every state change succeeds only for the lease holder at the attempt it claimed; otherwise it returns False and
an ``outbox_flush_conflict`` row is audited, never an exception (docs/explanation/relay.md, "Fencing").
"""

from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import ClaimedMessage, cap_error
from outbox_pipelines.core.storage.settlements import SettleStatus
from outbox_pipelines.core.storage.table import OutboxTable, Settlement, SharedTables


def claim_outbox(
    conn: psycopg.Connection, table_name: str, worker_id: str, limit: int = 10, lease_seconds: float = 60
) -> list[ClaimedMessage]:
    table = OutboxTable(conn, table_name)
    claimed = table.claim(worker_id, limit, lease_seconds)
    if table.contended_keys and conn.info.transaction_status == TransactionStatus.IDLE:
        table.release_contended()  # keys it marked waiting (sql/'s claim_key_behind); else the sweep's
    return claimed


def _settle(conn: psycopg.Connection, table_name: str, worker_id: str, settlement: Settlement) -> bool:
    return settlement.id in OutboxTable(conn, table_name).settle(worker_id, [settlement])


def ack_sent(
    conn: psycopg.Connection,
    table_name: str,
    item: ClaimedMessage,
    worker_id: str,
    memory_id: str | None = None,
    *,
    dedup: bool = False,
) -> bool:
    audit = m.AUDIT_DEDUP_HIT if dedup else m.AUDIT_SUCCESS
    return _settle(
        conn,
        table_name,
        worker_id,
        Settlement(
            item.id, item.attempts, SettleStatus.SENT, audit, error_code=m.DEDUP_HIT if dedup else None, ref=memory_id
        ),
    )


def fail_retry(
    conn: psycopg.Connection,
    table_name: str,
    item: ClaimedMessage,
    worker_id: str,
    error: str,
    next_attempt_at: datetime,
    error_code: str = m.UNKNOWN,
) -> bool:
    """Back to pending until ``next_attempt_at`` (computed by the caller, as the seed says)."""
    delay = SharedTables(conn).seconds_until(next_attempt_at)
    return _settle(
        conn,
        table_name,
        worker_id,
        Settlement(
            item.id,
            item.attempts,
            SettleStatus.PENDING,
            m.AUDIT_RETRY,
            delay_s=delay,
            error_code=error_code,
            error=cap_error(error),
        ),
    )


def mark_dead_by_worker(
    conn: psycopg.Connection,
    table_name: str,
    item: ClaimedMessage,
    worker_id: str,
    error: str,
    error_code: str = m.UNKNOWN,
) -> bool:
    return _settle(
        conn,
        table_name,
        worker_id,
        Settlement(
            item.id, item.attempts, SettleStatus.DEAD, m.AUDIT_DEAD, error_code=error_code, error=cap_error(error)
        ),
    )


def renew_lease(
    conn: psycopg.Connection, table_name: str, item: ClaimedMessage, worker_id: str, lease_seconds: float = 60
) -> bool:
    return item.id in OutboxTable(conn, table_name).renew(worker_id, [(item.id, item.attempts)], lease_seconds)


def check_dedup(conn: psycopg.Connection, table_name: str, target: str, payload_sha: str) -> dict[str, Any] | None:
    """A sent row with the same target (topic) and payload digest, if any."""
    return OutboxTable(conn, table_name).dedup_lookup([(target, payload_sha)]).get((target, payload_sha))
