"""The relay: claim → dispatch → settle, over one outbox table.

A newcomer reads it in this order:
- ``loop.py``: the ``Relay`` — the single-active lock, the run loop (one named step a turn), claiming, idling,
  the end; ``invocation.py``: what one run carries from step to step; ``recovery.py``: reconnecting after a
  database error, giving back the rows it held, the goodbye;
- ``budget.py``: what one invocation may spend (time, entries, once, a stop request); ``stop.py``: the stop
  request, safe from a signal handler; ``pause.py``: this relay's pause after a 429 or an open circuit;
  ``destination_health.py``: whether the destination is failing, its circuit and the pause all relays share;
- ``batch.py``: one batch, start to end; ``pipeline.py``: the same, delivering batch N while claiming N+1;
- ``dispatch.py``: which messages go to the destination (dedup), calling it; ``spans.py``: its tracing;
- ``settlement.py``: how each row ends (``plan_settlement``), writing it, the row-by-row fallback;
- ``counting.py``: a settled batch's counts, metrics and log lines; ``report.py``: the run's report;
- ``ordering.py``: ordered delivery per key, the parts beside the cycle (releasing keys, the sweep);
- ``lease_keeper.py``: the second thread (heartbeats, lease renewal); ``session.py``: the relay's
  database sessions and wake-ups; ``single_active.py``: the table lock; ``lease.py``: the lease protocol
  as functions;
- ``table_relay.py``: ``run_table_relay``, what the CLI and the Dagster op call;
- ``group.py``: a relay group, many tables in one process (``run_group_relay``); ``group_places.py``: how
  many are active at once; ``group_tables.py``: each table's state and the run's report;
  ``group_watcher.py``: the connection that wakes the quiet tables.
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
