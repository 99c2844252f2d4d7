"""The single-active lock: one relay of a single-active table works, the others stand by."""

from typing import Any

import psycopg

from outbox_pipelines.core.queries import shared_query


def try_lock(conn: psycopg.Connection[Any], table: str) -> bool:  # rows are dicts (db.connect)
    row = conn.execute(shared_query("outbox_relay_try_lock"), {"table_name": table}).fetchone()
    return bool(row and row["locked"])


def wait_for_lock(conn: psycopg.Connection, table: str, seconds: float) -> bool:
    """Block up to ``seconds`` on the single-active lock; True once held."""
    timeout_ms = str(max(int(seconds * 1000), 1))
    try:
        conn.execute(shared_query("outbox_relay_wait_lock"), {"table_name": table, "timeout_ms": timeout_ms})
        return True
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        conn.execute("SELECT set_config('lock_timeout', '0', false)")


def unlock(conn: psycopg.Connection, table: str) -> None:
    conn.execute(shared_query("outbox_relay_unlock"), {"table_name": table})
