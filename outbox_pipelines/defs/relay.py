"""Relay jobs: one graph, a job per table (tagged for the per-table run limit) and a generic one."""

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import dagster as dg
from pydantic import Field

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.relay import RelayReport, by_code, run_table_relay
from outbox_pipelines.core.relay.destination_health import display_name
from outbox_pipelines.core.relay.group import GroupRelay, run_group_relay
from outbox_pipelines.core.relay.group_tables import GroupReport
from outbox_pipelines.core.settings import DEFAULT_GROUP
from outbox_pipelines.defs.common import RefusedLaunch, metadata_values, resolve_table, table_asset_key
from outbox_pipelines.defs.resources import TABLE_TAG, Destinations, OutboxDb
from outbox_pipelines.orders import ORDERS_TABLE

# A relay run relays for its cadence plus an overlap, and a schedule starts one every cadence:
# the next run starts while this one still relays (a standby on a single-active table takes over
# the moment this one lets go of the table lock), so a hand-off leaves no gap. Long runs keep
# run history readable: 48 relay runs per table per day at the default 30 minutes.
RUN_MINUTES_ENV = "OUTBOX_RELAY_RUN_MINUTES"
RUN_MINUTE_CHOICES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)
DEFAULT_RUN_MINUTES = 30
OVERLAP_S = 60.0
OUTCOME_TAG = "outbox/outcome"
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


class RelayRunConfig(dg.Config):
    table: str = Field(default=ORDERS_TABLE, description="The outbox table to relay (see outbox.toml).")
    max_seconds: float = Field(
        default=default_run_seconds(),
        description="Stop claiming after this many seconds; the batch in flight is settled first.",
    )
    max_entries: int | None = Field(default=None, description="Stop after claiming this many messages.")
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


def _wait_through_interrupts(done: threading.Event) -> None:
    """Wait for the relay to settle, whatever further interrupts arrive meanwhile (a repeated stop)."""
    while True:
        try:
            done.wait()
            return
        except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
            continue


class Stoppable(Protocol):
    def request_stop(self) -> None: ...


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
    relays: list[Stoppable] = []
    results: list[T] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            results.append(start(relays.append))
        except BaseException as exc:  # noqa: BLE001 - handed to the op's thread
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
        for relay in relays:
            relay.request_stop()
        _wait_through_interrupts(done)
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


@dg.op(
    description="Claim, dispatch and settle one outbox table under the run's time and entry budget.",
    out=dg.Out(dg.Nothing),
)
def relay_table(
    context: dg.OpExecutionContext,
    config: RelayRunConfig,
    outbox_db: OutboxDb,
    outbox_destinations: Destinations,
) -> Iterator[dg.Output[None]]:
    settings = outbox_db.settings()
    table = resolve_table(settings, config.table)
    if not table.relay_enabled:
        context.log.warning(f"relay is disabled for {table.name} (OUTBOX_RELAY_ENABLED / relay_enabled); nothing done")
        context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: "disabled"})
        yield dg.Output(None, metadata={"table": table.name, "relay_enabled": False})
        return
    context.instance.add_run_tags(context.run_id, {TABLE_TAG: table.name})  # the Runs page filters by it
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
    context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: report.outcome})
    values = _report_metadata(report, table.mode)
    status = outbox_db.table_status(table)
    values.update({"backlog_after": status.backlog, "dead_total": status.counts.get("dead", 0)})
    if report.outcome == "destination_failing":
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


@dg.graph(description="Relay one outbox table.")
def relay_graph() -> None:
    relay_table()


# -- relay groups: one run relays every table of its group (docs/design.md "Relay groups") ---------------------
GROUP_TAG = "outbox/group"
# Every relay run (a group's or one table's) carries it: dagster.yaml caps relay runs with it so that maintenance,
# checks and replays always find a slot.
KIND_TAG, RELAY_KIND = "outbox/kind", "relay"
# A group run carries one of these per table it hosts ("outbox/table.billing_outbox": "hosted"): the Runs page
# filters the runs that relayed a table by it.
HOSTED = "hosted"
OBSERVE_EVERY_S = 300.0  # each table's asset observation, while a group run relays it
PROGRESS_EVERY_S = 30.0


def hosted_tag(table_name: str) -> str:
    return f"{TABLE_TAG}.{table_name}"


class GroupRunConfig(dg.Config):
    group: str = Field(default=DEFAULT_GROUP, description="The relay group (outbox.toml's group key) to relay.")
    max_seconds: float = Field(
        default=default_run_seconds(), description="Relay this long; every table's batch in flight is settled first."
    )
    once: bool = Field(default=False, description="Drain what each table has ready now, then end the run.")


class _Observer:
    """Each table's asset observation: what it did since the last one (every OBSERVE_EVERY_S, and at the end)."""

    def __init__(self, context: dg.OpExecutionContext, group: str) -> None:
        self.context, self.group = context, group
        self.seen: dict[str, dict[str, Any]] = {}
        self.last = time.monotonic()

    def observe(self, report: GroupReport, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < OBSERVE_EVERY_S:
            return
        window, self.last = now - self.last, now
        for table_name, table_report in report.tables.items():
            totals = table_report.as_dict()
            before = self.seen.get(table_name, {})
            delta = {
                k: totals[k] - before.get(k, 0)
                for k in ("claimed", "sent", "retried", "dead", "conflicts", "dedup_hits", "rate_limited")
            }
            problem = report.problems.get(table_name)
            if not any(delta.values()) and not problem:
                continue
            self.seen[table_name] = totals
            values = {
                "group": self.group,
                "window_s": round(window, 1),
                **delta,
                "outcome": table_report.outcome,
                "destination_failures": by_code(table_report.destination_failures) or None,
                "dead_by_code": by_code(table_report.dead_by_code) or None,
                "circuit": table_report.circuit,
                "problem": problem,
                **table_report.lag.percentiles(),
            }
            self.context.log_event(
                dg.AssetObservation(asset_key=table_asset_key(table_name), metadata=metadata_values(values))
            )


def _group_progress(context: dg.OpExecutionContext, observer: _Observer) -> Callable[[GroupRelay], None]:
    def progress(group: GroupRelay) -> None:
        report = group.report()
        active = [name for name, worker in group.workers.items() if worker.active]
        context.log.info(
            f"group {report.group}: {len(active)} of {len(group.workers)} tables active, sent "
            f"{report.sent} so far"
            + (f"; cannot relay: {', '.join(sorted(report.problems))}" if report.problems else "")
        )
        observer.observe(report)

    return progress


def _stopped_group(report: GroupReport) -> list[str]:
    return [
        f"{name}: stopped cleanly; sent {r.sent}, retried {r.retried}, dead {r.dead}; nothing left in sending"
        for name, r in report.tables.items()
        if r.claimed
    ]


@dg.op(
    description="Relay every table of a relay group, each on a worker of its own, until the run's time budget.",
    out=dg.Out(dg.Nothing),
)
def relay_group(
    context: dg.OpExecutionContext, config: GroupRunConfig, outbox_db: OutboxDb
) -> Iterator[dg.Output[None]]:
    settings = outbox_db.settings()
    if config.group not in settings.groups():  # a launch naming a group that has no table: the launcher's typo
        raise RefusedLaunch(
            "group",
            f"group: no relay group {config.group!r}; groups: "
            f"{', '.join(sorted(settings.groups())) or 'none'} (a table joins one with "
            "group = \"NAME\" in its section; the default group is 'default')",
        )
    observer = _Observer(context, config.group)
    context.log.info(
        f"relaying group {config.group} for up to {config.max_seconds:.0f}s: "
        f"{', '.join(settings.groups().get(config.group, [])) or 'no table'}"
    )
    for name in sorted(settings.broken):
        context.log.warning(f"left out: {settings.broken[name]}")
    try:
        report = _relay_in_thread(
            context,
            lambda started: run_group_relay(
                outbox_db.database_url(),
                settings,
                config.group,
                max_seconds=config.max_seconds,
                once=config.once,
                worker_prefix=f"dagster:{context.run_id[:8]}:{os.getpid()}",
                run_id=context.run_id,
                job=context.job_name,
                group_started=started,
                progress=_group_progress(context, observer),
            ),
            _stopped_group,
        )
    except ConfigError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    observer.observe(report, final=True)
    context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: report.outcome})
    for name, problem in sorted(report.problems.items()):
        context.log.warning(f"cannot relay {name}: {problem}")
    summary = {
        name: {"sent": r.sent, "retried": r.retried, "dead": r.dead, "dedup_hits": r.dedup_hits, "outcome": r.outcome}
        for name, r in report.tables.items()
        if r.claimed
    }
    context.log.info(
        f"group {config.group}: {report.outcome}; sent {report.sent} over {len(summary)} tables in "
        f"{report.seconds:.1f}s; stopped: {report.stopped_because}"
    )
    yield dg.Output(
        None,
        metadata=metadata_values(
            {
                "group": config.group,
                "outcome": report.outcome,
                "sent": report.sent,
                "tables_relayed": len(summary),
                "tables": summary or None,
                "problems": report.problems or None,
                "left_out": dict(settings.broken) or None,
                "duration_s": report.seconds,
                "stopped_because": report.stopped_because,
            }
        ),
    )


@dg.graph(description="Relay every table of a relay group.")
def relay_group_graph() -> None:
    relay_group()


def relay_group_job_name(group: str) -> str:
    return f"relay_group_{group}_job"


def relay_jobs(groups: dict[str, list[str]]) -> list[dg.JobDefinition]:
    """A job per relay group (its run config fixed to the group, tagged with it and with each table it hosts),
    plus ``relay_job`` for one table at a time (the launchpad's config names it)."""
    seconds = default_run_seconds()
    jobs = [
        relay_group_graph.to_job(
            name=relay_group_job_name(group),
            description=f"Relay the tables of group {group} ({len(tables)}: {', '.join(tables)}) for up to "
            f"{seconds / 60:.0f} min, each on a worker of its own.",
            config={"ops": {"relay_group": {"config": {"group": group, "max_seconds": seconds}}}},
            tags={GROUP_TAG: group, KIND_TAG: RELAY_KIND, **{hosted_tag(table): HOSTED for table in tables}},
            executor_def=dg.in_process_executor,
        )
        for group, tables in sorted(groups.items())
    ]
    jobs.append(
        relay_graph.to_job(
            name="relay_job",
            description="Relay one table: set ops.relay_table.config.table in the launchpad.",
            tags={KIND_TAG: RELAY_KIND},
            executor_def=dg.in_process_executor,
        )
    )
    return jobs
