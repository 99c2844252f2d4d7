"""Counting a settled batch: its counts for the report, the Prometheus metrics, a log line per retry and dead.

One pass over the batch; metrics are added once per label set (``counts.BatchTally``).
"""

import logging
import time
from collections.abc import Sequence

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay.destination_health import destination_failures
from outbox_pipelines.core.relay.report import BatchCounts, LagSample, by_code
from outbox_pipelines.core.storage.settlements import SettleStatus
from outbox_pipelines.core.storage.table import Settlement
from outbox_pipelines.core.telemetry.counts import BatchTally, TableRelayMetrics, tenant_label

log = logging.getLogger("outbox_pipelines.relay")

# The metric's result label of a delivered message, by outcome code (anything else: "success").
_DELIVERED_RESULTS: dict[str, str] = {m.DEDUP_HIT: "dedup", m.CONFLICT_PROCESSED: "conflict_processed"}
# Retries and deaths logged one by one per batch; the rest of a batch are one line by code. A batch of 1,000
# messages that all die of one cause (a payload the destination cannot take) is one story, not 1,000 lines.
LOGGED_PER_BATCH = 10


def count_settled_batch(
    table_name: str,
    batch: Sequence[ClaimedMessage],
    settlements: Sequence[Settlement],
    outcomes: Sequence[Outcome],
    settled: set[int],
    claimed_mono: float | None,
    lag: LagSample,
    relay_metrics: TableRelayMetrics | None = None,
) -> BatchCounts:
    """Count how each message ended; ``claimed_mono`` is time.monotonic() when the batch was claimed (None:
    unknown), and ``lag`` (and the delivery latency metric) gains each delivered message's created → delivered
    seconds."""
    counts = BatchCounts()
    latencies: list[float] = []
    in_dispatch = time.monotonic() - claimed_mono if claimed_mono is not None else None
    tally = BatchTally(table_name)
    for message, settlement, outcome in zip(batch, settlements, outcomes, strict=True):
        if settlement.id not in settled:
            counts.conflicts += 1
            tally.add(message, "conflict", in_dispatch)
            continue
        if settlement.status in (m.MessageState.SENT, "deleted"):
            counts.sent += 1
            counts.dedup_hits += outcome.code == m.DEDUP_HIT
            if message.claimed_at is not None and in_dispatch is not None:
                latencies.append(_waited_s(message) + in_dispatch)
                lag.add(latencies[-1])
            result = _DELIVERED_RESULTS.get(outcome.code or "", "success")
        elif settlement.status == SettleStatus.PENDING:
            result = _count_retry(table_name, message, settlement, outcome, counts)
        else:
            result = _count_dead(table_name, message, settlement, counts)
        tally.add(message, result, in_dispatch, final=settlement.status != SettleStatus.PENDING)
    tally.flush()
    if relay_metrics is not None:
        relay_metrics.settled(counts.sent, latencies, counts.retried_by_code, counts.dead_by_code)
    _log_the_rest(table_name, counts)
    _, failures = destination_failures(outcomes)
    counts.destination_failures.update(failures)
    return counts


def count_delivered_batch(
    table_name: str,
    batch: Sequence[ClaimedMessage],
    claimed_mono: float | None,
    lag: LagSample,
    relay_metrics: TableRelayMetrics | None = None,
) -> BatchCounts:
    """``count_settled_batch`` for a batch whose every message was delivered plainly (no dedup hit) and
    settled: the same counts, metrics and lag, without looking at each outcome."""
    in_dispatch = time.monotonic() - claimed_mono if claimed_mono is not None else None
    latencies: list[float] = []
    if in_dispatch is not None:
        # _waited_s inline (a call per message costs as much again): created → claimed, then → settled.
        latencies = [
            max((msg.claimed_at - msg.created_at).total_seconds(), 0.0) + in_dispatch
            for msg in batch
            if msg.claimed_at is not None
        ]
        lag.add_each(latencies, float)
    if relay_metrics is not None:
        relay_metrics.settled(len(batch), latencies)
    tally = BatchTally(table_name)
    tally.add_all(batch, "success", in_dispatch)
    tally.flush()
    return BatchCounts(sent=len(batch))


def _waited_s(message: ClaimedMessage) -> float:
    """Created → claimed (the database's clock on both sides)."""
    assert message.claimed_at is not None
    return max((message.claimed_at - message.created_at).total_seconds(), 0.0)


def _count_retry(
    table_name: str, message: ClaimedMessage, settlement: Settlement, outcome: Outcome, counts: BatchCounts
) -> str:
    counts.retried += 1
    code = settlement.error_code or m.UNKNOWN
    counts.retried_by_code[code] = counts.retried_by_code.get(code, 0) + 1
    if counts.retried <= LOGGED_PER_BATCH:
        _log_one(logging.INFO, table_name, message, "retries in %.1fs: %s", settlement.delay_s, settlement.error_code)
    if outcome.code == m.RATE_LIMITED:
        counts.rate_limited += 1
        counts.slow_down_s = max(counts.slow_down_s, settlement.delay_s)
    return m.OutcomeKind.RETRY


def _count_dead(table_name: str, message: ClaimedMessage, settlement: Settlement, counts: BatchCounts) -> str:
    counts.dead += 1
    code = settlement.error_code or m.UNKNOWN
    counts.dead_by_code[code] = counts.dead_by_code.get(code, 0) + 1
    if counts.dead <= LOGGED_PER_BATCH:
        _log_one(logging.WARNING, table_name, message, "is dead after %d attempts: %s", message.attempts, code)
    return m.OutcomeKind.DEAD


def _log_one(level: int, table_name: str, message: ClaimedMessage, what: str, *args: object) -> None:
    """One message's line: which message of which table (and tenant, as OUTBOX_TENANT_LABEL shows it), then ``what``."""
    log.log(
        level,
        "%s: message %s (event %s%s) " + what,
        table_name,
        message.id,
        message.event_id,
        _tenant_part(table_name, message),
        *args,
    )


def _log_the_rest(table_name: str, counts: BatchCounts) -> None:
    """One line for the retries and one for the deaths of the batch beyond those logged one by one."""
    if counts.retried > LOGGED_PER_BATCH:
        log.info(
            "%s: and %d more messages of this batch retry (%s in all)",
            table_name,
            counts.retried - LOGGED_PER_BATCH,
            by_code(counts.retried_by_code),
        )
    if counts.dead > LOGGED_PER_BATCH:
        log.warning(
            "%s: and %d more messages of this batch are dead (%s in all); "
            "'outbox-pipelines replay --table %s --error-code CODE --dry-run' lists them",
            table_name,
            counts.dead - LOGGED_PER_BATCH,
            by_code(counts.dead_by_code),
            table_name,
        )


def _tenant_part(table_name: str, message: ClaimedMessage) -> str:
    """ ", tenant X" as logs show it (masked or left out by OUTBOX_TENANT_LABEL), or nothing."""
    tenant = tenant_label(table_name, message.tenant_id)
    return f", tenant {tenant}" if tenant else ""
