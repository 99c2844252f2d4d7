"""plan_settlement: how a row ends, from the outcome, the attempt count and the table's policy."""

from dataclasses import replace
from datetime import UTC, datetime

from outbox_pipelines import Outcome, RetryPolicy
from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.relay import plan_settlement
from outbox_pipelines_tests.core.relay.events import events_settings


def test_plan_settlement_caps_retry_after_and_uses_injected_jitter():
    msg = ClaimedMessage(1, "e", None, "t", {}, "sha256:x", {}, 2, datetime.now(UTC))
    settings = events_settings(retry=RetryPolicy(base_s=4, max_s=100, max_attempts=5, jitter=0.5))
    capped = plan_settlement(msg, Outcome.retry(m.RATE_LIMITED, delay_s=10**9), settings)
    assert (capped.delay_s, capped.refund, capped.status) == (300.0, True, "pending")  # max_retry_after, no attempt
    assert (
        plan_settlement(
            msg, Outcome.retry(m.RATE_LIMITED, delay_s=10**9), replace(settings, max_retry_after_s=60.0)
        ).delay_s
        == 60.0
    )
    assert plan_settlement(msg, Outcome.retry(m.BROKER_5XX), settings, uniform=lambda lo, hi: hi).delay_s == 12.0
    assert plan_settlement(msg, Outcome.retry(m.BROKER_5XX), settings, uniform=lambda lo, hi: lo).delay_s == 4.0
    dedup = plan_settlement(msg, Outcome.sent(ref="r", code=m.DEDUP_HIT), replace(settings, on_success="delete"))
    assert (dedup.status, dedup.audit_code) == ("deleted", m.AUDIT_DEDUP_HIT)
