"""The relay: claim → dispatch → settle, over one outbox table.

Start at ``loop.py`` (the ``Relay``); the reading order of its modules: docs/explanation/codebase.md,
"The relay room, in reading order".
"""

from typing import TYPE_CHECKING, Any

from outbox_pipelines.core.relay.dispatch import DispatchPlan
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.relay.loop import Relay, default_worker_id
from outbox_pipelines.core.relay.report import BatchCounts, LagSample, RelayReport, by_code
from outbox_pipelines.core.relay.session import (
    RELAY_SESSION_OPTIONS,
    STATEMENT_TIMEOUT_MS,
)
from outbox_pipelines.core.relay.settlement import plan_settlement
from outbox_pipelines.core.relay.table_relay import run_table_relay

if TYPE_CHECKING:
    from outbox_pipelines.core.relay.spans import SendSpan


def __getattr__(name: str) -> Any:
    """``SendSpan`` is imported on first use: it imports OpenTelemetry's API, which a relay without tracing skips."""
    if name == "SendSpan":
        from outbox_pipelines.core.relay.spans import SendSpan

        return SendSpan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RELAY_SESSION_OPTIONS",
    "STATEMENT_TIMEOUT_MS",
    "BatchCounts",
    "DispatchPlan",
    "LagSample",
    "LeaseKeeper",
    "Relay",
    "RelayReport",
    "SendSpan",
    "by_code",
    "default_worker_id",
    "plan_settlement",
    "run_table_relay",
]
