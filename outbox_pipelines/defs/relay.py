"""Relay jobs: relaying one table (its op and graph) and what every relay run shares (its length, running the
relay in a thread Dagster can interrupt). Relay groups, one run relaying many tables, are relay_group.py's."""

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import dagster as dg
from pydantic import Field

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.models import MessageState
from outbox_pipelines.core.relay import RelayReport, by_code, run_table_relay
from outbox_pipelines.core.relay.destination_health import display_name
from outbox_pipelines.core.relay.report import RunOutcome
from outbox_pipelines.core.relay.stop import stop_timeout_s
from outbox_pipelines.core.settings.values import MAX_DURATION_S, MAX_WHOLE
from outbox_pipelines.defs.common import LaunchConfig, launch_schema, metadata_values, resolve_table, table_asset_key
from outbox_pipelines.defs.resources import TABLE_TAG, Destinations, OutboxDb

# A relay run relays for its cadence plus an overlap, and a schedule starts one every cadence:
# the next run starts while this one still relays (a standby on a single-active table takes over
# the moment this one lets go of the table lock), so a hand-off leaves no gap. Long runs keep
# run history readable: 48 relay runs per table per day at the default 30 minutes.
RUN_MINUTES_ENV = "OUTBOX_RELAY_RUN_MINUTES"
RUN_MINUTE_CHOICES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)
DEFAULT_RUN_MINUTES = 30
OVERLAP_S = 60.0
OUTCOME_TAG = "outbox/outcome"
# A relay run carries one of these per table it relays (".dagster/outbox.billing_outbox": "hosted"): the Runs page
# filters the runs that relayed a table by it (/runs?q[0]=tag:.dagster/outbox.billing_outbox=hosted).
# Dagster hides ".dagster/" tags from every page (a group of 20 tables made each run a wall of 19 tags, one and a
# half runs a screen) and still filters by them; the run shows outbox/group, outbox/kind and outbox/outcome.
HOSTED = "hosted"
HIDDEN_TAG_PREFIX = ".dagster/"  # dagster/_core/storage/tags.py: kept, filterable, never shown


def hosted_tag(table_name: str) -> str:
    return f"{HIDDEN_TAG_PREFIX}outbox.{table_name}"


T = TypeVar("T")


def run_minutes() -> int:
    raw = os.environ.get(RUN_MINUTES_ENV)
    if not raw:
        return DEFAULT_RUN_MINUTES
    if not raw.isdigit() or int(raw) not in RUN_MINUTE_CHOICES:
        raise ConfigError(
            f"{RUN_MINUTES_ENV}={raw!r}: use one of {', '.join(map(str, RUN_MINUTE_CHOICES))} "
            "(minutes between relay runs; each run relays that long plus a one-minute overlap)"
        )
    return int(raw)


def default_run_seconds() -> float:
    return run_minutes() * 60.0 + OVERLAP_S


class RelayRunConfig(LaunchConfig):
    table: str = Field(default="", description="The outbox table to relay: one the project declares (outbox.toml).")
    # The CLI's bounds (core/settings/values.py): a budget of nan or inf would never end; out of them, refused.
    max_seconds: float = Field(
        default=default_run_seconds(),
        ge=0,
        le=MAX_DURATION_S,
        allow_inf_nan=False,
        description="Stop claiming after this many seconds; the batch in flight is settled first.",
    )
    max_entries: int | None = Field(
        default=None, ge=1, le=MAX_WHOLE, description="Stop after claiming this many messages."
    )
    once: bool = Field(default=False, description="Drain what is ready now, then end the run.")


def _report_metadata(report: RelayReport, mode: str) -> dict[str, Any]:
    values = {
        "table": report.table,
        "mode": mode,
        "outcome": report.outcome,
        "worker": report.worker,
        "claimed": report.claimed,
        "sent": report.sent,
        "retried": report.retried,
        "dead": report.dead,
        "conflicts": report.conflicts,
        "dedup_hits": report.dedup_hits,
        "requeued_expired_leases": report.requeued,
        "rate_limited": report.rate_limited,
        "db_errors": report.db_errors,
        "destination_failures": by_code(report.destination_failures) or None,
        "circuit": report.circuit,
        "circuit_probes": report.probes,
        "duration_s": report.seconds,
        "throughput_per_s": report.throughput if report.seconds >= 1.0 else None,
        "stopped_because": report.stopped_because,
        "dead_by_code": by_code(report.dead_by_code) or None,
        # Of the messages this run delivered (created → delivered), not of the table's history.
        **report.lag.percentiles(),
    }
    if mode == "single-active":
        values["single_active_lock_held"] = report.lock_held
    return values


def _wait_through_interrupts(done: threading.Event) -> bool:
    """Wait for the relay to settle, whatever further interrupts arrive meanwhile (a repeated stop), at most the
    relay's stop bound (a group ends its stuck tables' wait within it: core/relay/stop.py); whether it did."""
    deadline = time.monotonic() + stop_timeout_s() + 5.0
    while True:
        try:
            return done.wait(max(deadline - time.monotonic(), 0.0))
        except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
            continue


class Stoppable(Protocol):
    def request_stop(self) -> None: ...


class _StopRelay:
    """The relays a run started, and whether a stop was asked for.

    The interrupt can land before the relay thread has built its relay (building a destination
    connects to a broker; under load that takes seconds). A stop asked for then must still reach
    the relay when it registers: missed, the relay ran its whole budget and `dev` waited a minute.
    """

    def __init__(self) -> None:
        self._relays: list[Stoppable] = []
        self._requested = False

    def register(self, relay: Stoppable) -> None:
        self._relays.append(relay)  # append before reading the flag; request() sets it before reading the list
        if self._requested:
            relay.request_stop()

    def request(self) -> None:
        self._requested = True
        for relay in list(self._relays):
            relay.request_stop()


def _relay_in_thread(
    context: dg.OpExecutionContext, start: Callable[[Callable[[Stoppable], None]], T], stopped: Callable[[T], list[str]]
) -> T:
    """Run a relay (one table's, or a group's) on a thread of its own; the op's thread only waits.

    Dagster delivers "Terminate" (and a clean stop of `outbox-pipelines dev`) as an interrupt
    raised wherever the op's thread happens to be. Raised inside a database call it would
    abandon the batch in flight; raised here it only asks the relay to stop, waits while the
    relay settles its batches, and then lets the interrupt end the run as CANCELED.
    ``stopped`` says, line by line, what the relay did before it stopped.
    """
    relays = _StopRelay()
    results: list[T] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            results.append(start(relays.register))
        except BaseException as exc:  # handed to the op's thread
            errors.append(exc)
        finally:
            done.set()

    # Wait on an Event, not Thread.join: an interrupt landing inside join() makes Python 3.11
    # consider the thread finished, and the wait for the settle would be skipped.
    threading.Thread(target=target, name="outbox-relay", daemon=True).start()
    try:
        while not done.wait(0.5):
            pass
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
        # Ask first: a second interrupt may land in the log call below (a database write), and
        # must find the stop already requested.
        relays.request()
        if not _wait_through_interrupts(done):
            context.log.error(
                "termination requested: the relay did not stop in time (a database or destination call that does "
                "not return); the run ends now, its rows go back to pending when their lease expires"
            )
            raise
        context.log.info("termination requested: finished and settled the batch in flight")
        for result in results:
            for line in stopped(result):
                context.log.info(line)
        context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: "cancelled"})
        raise
    if errors:
        raise errors[0]
    return results[0]


def _stopped_table(report: RelayReport) -> list[str]:
    return [
        f"{report.table}: stopped cleanly; sent {report.sent}, retried {report.retried}, dead {report.dead} "
        f"in {report.seconds:.1f}s; nothing left in sending"
    ]


def relay_table(
    context: dg.OpExecutionContext,
    config: RelayRunConfig,
    outbox_db: OutboxDb,
    outbox_destinations: Destinations,
) -> Iterator[dg.Output[None]]:
    """The body of the relay_table op: one table relayed under the run's budget, its report in metadata."""
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    if not table.relay_enabled:
        context.log.warning(f"relay is disabled for {table.name} (OUTBOX_RELAY_ENABLED / relay_enabled); nothing done")
        context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: "disabled"})
        yield dg.Output(None, metadata={"table": table.name, "relay_enabled": False})
        return
    # outbox/table: the per-table run limit (dagster.yaml) and the Runs page's filter; the hidden tag: the filter
    # that finds every run that relayed the table, a group's or this one
    context.instance.add_run_tags(context.run_id, {TABLE_TAG: table.name, hosted_tag(table.name): HOSTED})
    destination = outbox_destinations.for_table(table, settings)
    context.log.info(
        f"relaying {table.name} → {display_name(destination.name)} for up to {config.max_seconds:.0f}s ({table.mode})"
    )
    if table.delivers_nowhere:
        context.log.warning(table.delivers_nowhere)
    try:
        report = _relay_in_thread(
            context,
            lambda started: run_table_relay(
                outbox_db.database_url(),
                settings,
                table.name,
                max_seconds=config.max_seconds,
                max_entries=config.max_entries,
                once=config.once,
                destination=destination,
                worker_id=f"dagster:{context.run_id[:8]}:{os.getpid()}",
                run_id=context.run_id,
                job=context.job_name,
                relay_started=started,
                progress=lambda r: context.log.info(f"{r.table}: {r.progress_line()}"),
            ),
            _stopped_table,
        )
    finally:
        destination.close()
    context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: report.outcome.value})
    values = _report_metadata(report, table.mode)
    status = outbox_db.table_status(table)
    values.update({"backlog_after": status.backlog, "dead_total": status.counts.get(MessageState.DEAD, 0)})
    if report.outcome == RunOutcome.DESTINATION_FAILING:
        context.log.warning(
            f"{table.name}: nothing was delivered: the destination failed "
            f"({values['destination_failures']}); {report.retried} messages wait and retry with backoff. "
            "The destination check on the table's asset says how long it has been failing."
        )
    context.log.info(
        f"{table.name}: {report.outcome}; sent {report.sent}, retried {report.retried}, dead {report.dead}, "
        f"conflicts {report.conflicts}, dedup hits {report.dedup_hits} in {report.seconds:.1f}s; "
        f"stopped: {report.stopped_because}"
    )
    metadata = metadata_values(values)
    context.log_event(dg.AssetObservation(asset_key=table_asset_key(table.name), metadata=metadata))
    yield dg.Output(None, metadata=metadata)


def relay_graph(tables: Sequence[str] = ()) -> dg.GraphDefinition:
    """The graph of ``relay_job``: its op's ``table`` one of ``tables`` (the code location's, a Dagster Enum: a
    typo starts no run; a table dropped from the settings since the location loaded is a refused launch)."""

    @dg.op(
        name="relay_table",
        description="Claim, dispatch and settle one outbox table under the run's time and entry budget.",
        config_schema=launch_schema(RelayRunConfig, tables),
        out=dg.Out(dg.Nothing),
    )
    def relay_table_op(
        context: dg.OpExecutionContext, outbox_db: OutboxDb, outbox_destinations: Destinations
    ) -> Iterator[dg.Output[None]]:
        yield from relay_table(context, RelayRunConfig(**context.op_config), outbox_db, outbox_destinations)

    @dg.graph(name="relay_graph", description="Relay one outbox table.")
    def one_table() -> None:
        relay_table_op()

    return one_table
