"""The single-active lock: one relay of a single-active table works, the others stand by."""

from outbox_pipelines.core.storage.table import OutboxTable


def try_lock(outbox_table: OutboxTable) -> bool:
    """Take the table's lock if nobody holds it."""
    return outbox_table.try_relay_lock()


def wait_for_lock(outbox_table: OutboxTable, seconds: float) -> bool:
    """Block up to ``seconds`` on the single-active lock; True once held."""
    try:
        return outbox_table.wait_for_relay_lock(int(seconds * 1000))
    finally:
        # The bounded wait set the session's lock_timeout: the relay's other statements wait as long as they need.
        outbox_table.reset_lock_timeout()


def unlock(outbox_table: OutboxTable) -> None:
    outbox_table.release_relay_lock()
