"""Which messages of a batch go to the destination, calling it, and every message's outcome.

A message claimed past the table's ``max_attempts`` (the limit was lowered while it
waited) is dead without a delivery. With dedup on, a message whose payload was
already delivered on its topic is answered from the table (seed 003), and in-batch
twins ride on the first one's delivery: only the rest reach the destination.
"""

import logging
from dataclasses import dataclass, field

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.core.telemetry import tracing

log = logging.getLogger("outbox_pipelines.relay")


@dataclass
class DispatchPlan:
    """A batch's outcomes known before delivery (dedup hits), what to send, and in-batch twins."""

    outcomes: list[Outcome | None]
    to_send: list[int]
    followers: dict[int, int] = field(default_factory=dict)


def plan_dispatch(
    outbox_table: OutboxTable, batch: list[ClaimedMessage], dedup: bool, max_attempts: int
) -> DispatchPlan:
    """Which messages go to the destination; those past ``max_attempts`` die here, dedup hits (seed 003) are
    answered from the table."""
    plan = DispatchPlan(outcomes=[None] * len(batch), to_send=list(range(len(batch))))
    if batch and max(msg.attempts for msg in batch) > max_attempts:
        _past_the_limit(plan, batch, max_attempts)
    if not dedup:
        return plan
    keys = [(msg.topic, msg.payload_sha) for msg in batch]
    already = outbox_table.dedup_lookup(sorted({keys[index] for index in plan.to_send}))
    first_in_batch: dict[tuple[str, str], int] = {}
    sendable, plan.to_send = plan.to_send, []
    for index in sendable:
        key = keys[index]
        if key in already:
            plan.outcomes[index] = Outcome.sent(ref=already[key]["result_ref"], code=m.DEDUP_HIT)
        elif key in first_in_batch:
            plan.followers[index] = first_in_batch[key]
        else:
            first_in_batch[key] = index
            plan.to_send.append(index)
    return plan


def _past_the_limit(plan: DispatchPlan, batch: list[ClaimedMessage], max_attempts: int) -> None:
    """Rows that waited at or past a limit since lowered: dead now, audited as any death, never delivered."""
    for index, msg in enumerate(batch):
        if msg.attempts > max_attempts:
            plan.outcomes[index] = Outcome.dead(
                m.MAX_ATTEMPTS,
                f"not delivered: attempt {msg.attempts} is past max_attempts = {max_attempts} "
                "(lowered since this message last failed); replay it to deliver it again",
            )
    plan.to_send = [index for index in plan.to_send if plan.outcomes[index] is None]


def deliver_planned(
    destination: Destination, table_name: str, batch: list[ClaimedMessage], plan: DispatchPlan
) -> list[Outcome]:
    """Call the destination (no database work here: this may run on the pipeline thread)."""
    if not plan.to_send:
        return []
    messages = [batch[i] for i in plan.to_send]
    span = None
    if tracing.enabled():  # off: no work at all, and OpenTelemetry's API never imported
        from outbox_pipelines.core.relay.spans import SendSpan

        span = SendSpan(destination, table_name, messages)
        messages = span.messages
    try:
        outcomes = destination.deliver(messages)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a destination must not raise; if it does, nothing is lost
        log.exception("destination %s raised", destination.name)
        outcomes = [Outcome.retry(m.UNKNOWN, f"destination raised {type(exc).__name__}: {exc}")] * len(messages)
    if span is not None:
        span.end(outcomes)
    return outcomes


def combine_outcomes(plan: DispatchPlan, delivered: list[Outcome]) -> list[Outcome]:
    """Every message's outcome, in batch order: answered from the table, delivered, or its twin's."""
    outcomes = list(plan.outcomes)
    # A destination that breaks its contract may answer fewer outcomes: the rest end as "no outcome" below.
    for index, outcome in zip(plan.to_send, delivered, strict=False):
        outcomes[index] = outcome
    for index, leader in plan.followers.items():
        lead = outcomes[leader]
        assert lead is not None
        outcomes[index] = Outcome.sent(ref=lead.ref, code=m.DEDUP_HIT) if lead.kind == m.OutcomeKind.SENT else lead
    return [o if o is not None else Outcome.retry(m.UNKNOWN, "no outcome") for o in outcomes]
