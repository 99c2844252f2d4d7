"""Relay one configured table: the one entry point the CLI's relay command and the Dagster op share.

The one relay module that builds destinations (through wiring); the others know a destination only
through the Destination base class.
"""

import gc
from collections.abc import Callable

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.wiring import build_destination
from outbox_pipelines.core.relay.budget import check_budget
from outbox_pipelines.core.relay.loop import Relay
from outbox_pipelines.core.relay.report import RelayReport
from outbox_pipelines.core.relay.stop import StopDeadline
from outbox_pipelines.core.settings import Settings
from outbox_pipelines.core.settings.owners import without_tables_owned_elsewhere
from outbox_pipelines.core.storage import pooler, schema_version
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.telemetry import tracing


def run_table_relay(
    url: str,
    settings: Settings,
    table_name: str,
    *,
    max_seconds: float | None = None,
    max_entries: int | None = None,
    once: bool = False,
    worker_id: str | None = None,
    progress: Callable[[RelayReport], None] | None = None,
    install_signal_handlers: bool = False,
    destination: Destination | None = None,
    run_id: str | None = None,
    job: str | None = None,
    relay_started: Callable[[Relay], None] | None = None,
) -> RelayReport:
    """Relay one configured table: build its destination (unless given), run under the budget, close it."""
    check_budget(max_seconds, max_entries)
    freeze_startup_objects()
    tracing.configure_from_env("outbox-relay")  # no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    with connect(url) as conn:  # both checks on one connection (a connection costs a relay's start milliseconds)
        schema_version.require_current_schema(url, conn)  # new code on an old schema: one clear refusal, at once
        table = without_tables_owned_elsewhere(url, settings, conn).table(table_name)  # another project's: refused
    owned = destination is None
    destination = destination or build_destination(table, settings)
    relay = Relay(
        url,
        table,
        destination,
        worker_id=worker_id,
        progress=progress,
        run_id=run_id,
        job=job,
        direct_url=pooler.direct_database_url(),
    )
    deadline = None
    if install_signal_handlers:  # the process is the relay's (the CLI's): its stop is bounded (relay/stop.py)
        deadline = StopDeadline(relay.stop_request, f"relay {table.name}").arm(budget_s=max_seconds)
        relay.install_signal_handlers()
    if relay_started is not None:
        relay_started(relay)  # lets the caller stop it (Dagster's run termination)
    try:
        return relay.run(max_seconds=max_seconds, max_entries=max_entries, once=once)
    finally:
        if owned:
            destination.close()
        if deadline is not None:
            deadline.disarm()


_frozen = False


def freeze_startup_objects() -> None:
    """Move every object alive now (the imported modules, Dagster's, the settings) out of the garbage
    collector's sight, once per process. A relay allocates a few objects per message, so the collector runs
    often, and each full pass walked all of them: 60-70 ms a pass, about 13 % of a drain at batch 1,000
    (bench/results.md). Objects frozen here are still freed when their last reference goes; only a cycle
    among them would stay, and a relay's process does not drop its imports."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
