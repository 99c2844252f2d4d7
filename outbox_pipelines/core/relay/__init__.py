"""The relay: claim → dispatch → settle, over one outbox table.

A newcomer reads it in this order:
- ``loop.py``: the ``Relay`` — the single-active lock, the run loop (one named step a turn),
  reconnecting after a database error, the goodbye;
- ``budget.py``: what one invocation may spend (time, entries, once, a stop request);
  ``pause.py``: this relay's pause after a 429 or an open circuit;
- ``batch.py``: one batch, start to end; ``pipeline.py``: the same, delivering batch N while claiming N+1;
- ``dispatch.py``: which messages go to the destination (dedup), calling it; ``spans.py``: its tracing;
- ``settlement.py``: how each row ends (``plan_settlement``), writing it, the row-by-row fallback;
- ``counting.py``: a settled batch's counts, metrics and log lines; ``report.py``: the run's report;
- ``lease_keeper.py``: the second thread (heartbeats, lease renewal); ``session.py``: the relay's
  database sessions and wake-ups; ``single_active.py``: the table lock;
- ``table_relay.py``: ``run_table_relay``, what the CLI and the Dagster op call.
"""

from outbox_pipelines.core.relay.dispatch import DispatchPlan
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines.core.relay.loop import Relay, default_worker_id
from outbox_pipelines.core.relay.report import BatchCounts, LagSample, RelayReport, by_code
from outbox_pipelines.core.relay.session import (
    RELAY_SESSION_OPTIONS,
    STATEMENT_TIMEOUT_MS,
)
from outbox_pipelines.core.relay.settlement import plan_settlement
from outbox_pipelines.core.relay.spans import SendSpans
from outbox_pipelines.core.relay.table_relay import run_table_relay

__all__ = [
    "RELAY_SESSION_OPTIONS",
    "STATEMENT_TIMEOUT_MS",
    "BatchCounts",
    "DispatchPlan",
    "LagSample",
    "LeaseKeeper",
    "Relay",
    "RelayReport",
    "SendSpans",
    "by_code",
    "default_worker_id",
    "plan_settlement",
    "run_table_relay",
]
