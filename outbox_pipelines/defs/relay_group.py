"""Relay groups' jobs and tags: one run relays every table of its group.

Why: docs/explanation/front-ends.md, "Relay groups".
"""

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.relay import by_code
from outbox_pipelines.core.relay.group import GroupRelay, run_group_relay
from outbox_pipelines.core.relay.group_tables import GroupReport
from outbox_pipelines.core.settings import DEFAULT_GROUP
from outbox_pipelines.core.settings.values import MAX_DURATION_S
from outbox_pipelines.defs.common import LaunchConfig, RefusedLaunch, metadata_values, table_asset_key
from outbox_pipelines.defs.relay import (
    HOSTED,
    OUTCOME_TAG,
    _relay_in_thread,
    default_run_seconds,
    hosted_tag,
    relay_graph,
)
from outbox_pipelines.defs.resources import OutboxDb

# -- relay groups: one run relays every table of its group (docs/explanation/front-ends.md, "Relay groups") --
GROUP_TAG = "outbox/group"
# Every relay run (a group's or one table's) carries it: dagster.yaml caps relay runs with it so that maintenance,
# checks and replays always find a slot.
KIND_TAG, RELAY_KIND = "outbox/kind", "relay"
OBSERVE_EVERY_S = 300.0  # each table's asset observation, while a group run relays it


class GroupRunConfig(LaunchConfig):
    group: str = Field(default=DEFAULT_GROUP, description="The relay group (outbox.toml's group key) to relay.")
    max_seconds: float = Field(  # bounded as the CLI's --max-seconds (core/settings/values.py)
        default=default_run_seconds(),
        ge=0,
        le=MAX_DURATION_S,
        allow_inf_nan=False,
        description="Relay this long; every table's batch in flight is settled first.",
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
    """A line every 30 s (the group's progress_every_s) while the group sends, or when the tables it cannot relay
    change; nothing while it idles (an idle table gives its worker up: "0 of 19 tables active" every 30 s told
    nobody anything)."""
    said: dict[str, Any] = {"sent": 0, "problems": []}

    def progress(group: GroupRelay) -> None:
        report = group.report()
        problems = sorted(report.problems)
        if report.sent != said["sent"] or problems != said["problems"]:
            sending = sorted(name for name, worker in group.workers.items() if worker.active)
            context.log.info(
                f"group {report.group}: sent {report.sent} so far (+{report.sent - said['sent']})"
                + (f"; relaying {', '.join(sending)}" if sending else "")
                + (f"; cannot relay: {', '.join(problems)}" if problems else "")
            )
            said.update(sent=report.sent, problems=problems)
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
    context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: report.outcome.value})
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


def relay_jobs(groups: dict[str, list[str]], tables: Sequence[str] | None = None) -> list[dg.JobDefinition]:
    """A job per relay group (its run config fixed to the group, tagged with it and with each table it hosts),
    plus ``relay_job`` for one table at a time (the launchpad's config names it: one of ``tables``, by default
    the groups')."""
    if tables is None:
        tables = sorted({table for names in groups.values() for table in names})
    seconds = default_run_seconds()
    jobs = [
        relay_group_graph.to_job(
            name=relay_group_job_name(group),
            description=f"Relay the tables of group {group} ({len(tables)}: {', '.join(tables)}) for up to "
            f"{duration_words(seconds)}, each on a worker of its own.",
            config={"ops": {"relay_group": {"config": {"group": group, "max_seconds": seconds}}}},
            tags={GROUP_TAG: group, KIND_TAG: RELAY_KIND, **{hosted_tag(table): HOSTED for table in tables}},
            executor_def=dg.in_process_executor,
        )
        for group, tables in sorted(groups.items())
    ]
    jobs.append(
        relay_graph(tables).to_job(
            name="relay_job",
            description="Relay one table: set ops.relay_table.config.table in the launchpad.",
            tags={KIND_TAG: RELAY_KIND},
            executor_def=dg.in_process_executor,
        )
    )
    return jobs
