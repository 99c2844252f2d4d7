"""How a delivered message's row ends (``plan_settlement``), and writing a batch's settlements.

Planning is pure: the outcome, the attempt count and the table's policy decide.
Writing falls back to row by row when the database refuses the batch, so one
unrecordable row cannot hold the others back.
"""

import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypedDict

import psycopg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import ClaimedMessage, Outcome, OutcomeKind, cap_error
from outbox_pipelines.core.relay.destination_health import DESTINATION_FAILURES
from outbox_pipelines.core.retry import UniformSource
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.storage.settlements import SettleStatus
from outbox_pipelines.core.storage.table import OutboxTable, Settlement

log = logging.getLogger("outbox_pipelines.relay")


def plan_settlement(
    message: ClaimedMessage,
    outcome: Outcome,
    table: TableSettings,
    uniform: UniformSource = random.uniform,
    *,
    circuit_open: bool = False,
) -> Settlement:
    """Decide the row's next state from the outcome, the attempt count and the table's policy.

    The retry budget is for failures of the message itself. Throttling (429, or any
    Retry-After) and destination failures while the table's circuit is open give the
    attempt back: a broker that throttles or is down for an hour dead-letters nothing.
    """
    if outcome.kind == OutcomeKind.SENT:
        audit = m.AUDIT_DEDUP_HIT if outcome.code == m.DEDUP_HIT else m.AUDIT_SUCCESS
        status = SettleStatus.DELETED if table.on_success == "delete" else SettleStatus.SENT
        return Settlement(
            message.id, message.attempts, status, audit, error_code=outcome.code, ref=m.storable_text(outcome.ref)
        )
    code = m.storable_text(outcome.code) or m.UNKNOWN
    error = cap_error(outcome.error)
    if outcome.kind == OutcomeKind.DEAD:
        return Settlement(message.id, message.attempts, SettleStatus.DEAD, m.AUDIT_DEAD, error_code=code, error=error)
    if outcome.code == m.RATE_LIMITED or outcome.delay_s is not None:
        return Settlement(
            message.id,
            message.attempts,
            SettleStatus.PENDING,
            m.AUDIT_RETRY,
            error_code=code,
            error=error,
            delay_s=throttle_delay(outcome, message, table, uniform),
            refund=True,
        )
    if circuit_open and outcome.code in DESTINATION_FAILURES:
        # The circuit paces the retries (one probe at a time): due again at once, attempt given back.
        return Settlement(
            message.id, message.attempts, SettleStatus.PENDING, m.AUDIT_RETRY, error_code=code, error=error, refund=True
        )
    if message.attempts >= table.retry.max_attempts:
        error = f"gave up after {message.attempts} of {table.retry.max_attempts} attempts: {outcome.error or code}"
        return Settlement(
            message.id, message.attempts, SettleStatus.DEAD, m.AUDIT_DEAD, error_code=code, error=cap_error(error)
        )
    return Settlement(
        message.id,
        message.attempts,
        SettleStatus.PENDING,
        m.AUDIT_RETRY,
        error_code=code,
        error=error,
        delay_s=table.retry.delay_s(message.attempts, uniform),
    )


def throttle_delay(outcome: Outcome, message: ClaimedMessage, table: TableSettings, uniform: UniformSource) -> float:
    """Retry-After, believed up to the table's max_retry_after (the cap is logged); backoff without one."""
    if outcome.delay_s is None:
        return table.retry.delay_s(message.attempts, uniform)
    asked = max(outcome.delay_s, 0.0)
    if asked > table.max_retry_after_s:
        log.warning(
            "%s: the destination asked to retry after %.0fs; capped at max_retry_after %.0fs",
            table.name,
            asked,
            table.max_retry_after_s,
        )
        return table.max_retry_after_s
    return asked


def settle_batch(
    outbox_table: OutboxTable,
    worker: str,
    settlements: list[Settlement],
    table: TableSettings,
    *,
    held: bool,
    claimed_at: datetime | None = None,
) -> set[int] | None:
    """Settle the batch in one statement: the ids settled, or None when the database refused it for a
    data reason (then ``settle_row_by_row`` isolates the row that caused it). A lost connection or a
    statement timeout is not a data reason: it propagates."""
    return _unless_refused(
        outbox_table,
        table,
        lambda: outbox_table.settle(worker, settlements, claimed_at=claimed_at, **settle_options(table, held)),
    )


def settle_delivered(
    outbox_table: OutboxTable,
    worker: str,
    batch: Sequence[ClaimedMessage],
    outcomes: Sequence[Outcome],
    table: TableSettings,
    *,
    held: bool,
) -> set[int] | None:
    """``settle_batch`` for a batch delivered whole with nothing else to record (every settlement
    would be plainly sent): no settlement is planned per message."""
    fast_commit = commits_without_flush(outbox_table.conn, table, delivered=len(batch), held=held)
    # A destination's references (a broker's stream:seq or offset) go with them, kept as result_ref and in
    # the audit as for any settle.
    refs = [outcome.ref for outcome in outcomes] if any(outcome.ref for outcome in outcomes) else None
    return _unless_refused(
        outbox_table,
        table,
        lambda: outbox_table.settle_sent(
            worker,
            [msg.id for msg in batch],
            [msg.attempts for msg in batch],
            audit_code=m.AUDIT_SUCCESS,
            refs=refs,
            fast_commit=fast_commit,
            claimed_at=batch[0].claimed_at if batch else None,
            **settle_options(table, held),
        ),
        first_write=held,
    )


def commits_without_flush(conn: psycopg.Connection, table: TableSettings, *, delivered: int, held: bool) -> bool:
    """Whether a batch of ``delivered`` messages, delivered whole, settles without waiting for its WAL flush.

    A held batch: always. Its transaction is the relay's own (its claim wrote nothing; the rest is the relay's
    bookkeeping, such as the destination's health), and a settle a database crash loses (at most the last few
    hundred milliseconds of them) puts its rows back as they were, to be sent again, which at-least-once allows:
    the flush was about a tenth of a small backlog's time (bench/results.md).
    A leased batch: when smaller than ``batch_size`` (it emptied the queue, and at a trickle each message would
    wait behind the flush before it), and only on the relay's own autocommit session: inside a caller's
    transaction it would make all of it so. A full leased batch waits, one flush for the whole batch.
    """
    if held:
        return True
    return delivered < table.batch_size and conn.autocommit and not _in_transaction(conn)


_SAVEPOINT = "SAVEPOINT outbox_settle"
_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT outbox_settle"


def _in_transaction(conn: psycopg.Connection) -> bool:
    return conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def _unless_refused(
    outbox_table: OutboxTable, table: TableSettings, settle: Callable[[], set[int]], *, first_write: bool = False
) -> set[int] | None:
    """``settle()``, or None when the database refused it for a data reason (the caller goes row by row).

    ``first_write``: the settle is the first write of a held batch's transaction, which holds only the batch's
    locks. A refusal then rolls that transaction back, and the rows, pending and unchanged, are settled row by
    row in transactions of their own; no savepoint is sent before each batch (a round trip, and a subtransaction
    for the server: bench/relay_fixed_costs.py).
    """
    conn = outbox_table.conn
    savepoint = _in_transaction(conn) and not first_write
    try:
        if savepoint:
            # So that a refused statement does not doom the outer transaction. Never released: the commit that
            # follows releases it, a round trip less per batch than ``conn.transaction()`` (bench/relay_fixed_costs.py).
            conn.execute(_SAVEPOINT)
        return settle()
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        if savepoint:
            conn.execute(_ROLLBACK_TO_SAVEPOINT)
        elif _in_transaction(conn):
            conn.rollback()  # the held batch's locks go with it: another relay may claim its rows meanwhile
        log.warning("relay %s: batch settle refused (%s); settling row by row", table.name, exc)
        return None


def plainly_sent(outcomes: Sequence[Outcome]) -> bool:
    """Every outcome a delivery with nothing more to record than its reference (no dedup hit): what
    ``settle_delivered`` settles, for a table that marks sent rows."""
    return all(o.kind == OutcomeKind.SENT and o.code is None for o in outcomes)


class SettleOptions(TypedDict):
    held: bool
    audit_successes: bool
    pass_over_dead: bool


def settle_options(table: TableSettings, held: bool) -> SettleOptions:
    """How ``OutboxTable.settle`` writes this table's outcomes: held rows (``held``: the batch is locked by the
    relay's open transaction, not leased), whether deliveries are audited, and whether a keyed message that
    dies lets the rest of its key go."""
    return {
        "held": held,
        "audit_successes": table.audit == "all",
        "pass_over_dead": table.ordering == "skip",
    }


def settle_row_by_row(
    outbox_table: OutboxTable, worker: str, settlements: list[Settlement], table: TableSettings, *, held: bool
) -> set[int]:
    """Each row in a transaction (a savepoint inside one) of its own; a refused row ends as DB_ERROR, never stuck."""
    settled: set[int] = set()
    options = settle_options(table, held)
    for settlement in settlements:
        try:
            with outbox_table.conn.transaction():
                settled |= outbox_table.settle(worker, [settlement], **options)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            # The unrecordable row is audited whatever the audit setting: it is a failure.
            settled |= outbox_table.settle(
                worker, [_unrecordable(settlement, exc)], held=options["held"], pass_over_dead=options["pass_over_dead"]
            )
    return settled


def _unrecordable(settlement: Settlement, exc: psycopg.Error) -> Settlement:
    """Delivered but not recordable (a delete-on-success the database refused): completed, as seed
    002 says; dead would make a replay run the handler again. Anything else: dead, visible."""
    delivered = settlement.status in (SettleStatus.SENT, SettleStatus.DELETED)
    return Settlement(
        settlement.id,
        settlement.attempts,
        SettleStatus.SENT if delivered else SettleStatus.DEAD,
        m.AUDIT_DB_ERROR,
        error_code=m.ErrorCode.DB_ERROR,
        error=cap_error(f"could not record the outcome ({settlement.status}, {settlement.error_code}): {exc}"),
    )
