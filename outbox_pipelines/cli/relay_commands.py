"""``outbox-pipelines relay``: one table's relay (``--table``) or a relay group's (``--group``) in this process,
run by the same functions as the Dagster relay op (``run_table_relay``, ``run_group_relay``); this starts them
with the command's options and prints their progress and final report."""

import argparse
import json
from dataclasses import replace
from typing import TYPE_CHECKING

from outbox_pipelines.cli.inputs import database_url, say_left_out, settings_of
from outbox_pipelines.cli.output import EXIT_OK, UsageError, say
from outbox_pipelines.core.relay import Relay, RelayReport, by_code, default_worker_id, run_table_relay
from outbox_pipelines.core.relay.destination_health import display_name

if TYPE_CHECKING:
    from outbox_pipelines.core.relay.group import GroupRelay


def serve_table_metrics(url: str, args: argparse.Namespace, tables: dict[str, bool]) -> None:
    """``--metrics-port``: the tables' gauges and this process's counters on /metrics (imported only then)."""
    from outbox_pipelines.cli.metrics_command import metrics_host, serve_metrics
    from outbox_pipelines.core.oncall import table_metrics

    table_metrics.watch_tables(url, list(tables), tables)
    say(f"Prometheus metrics on {serve_metrics(args.metrics_port, metrics_host(args.metrics_host))}")


def print_progress(report: RelayReport) -> None:
    say(f"[{report.table}] {report.seconds:.0f}s: {report.progress_line()}")


def report_line(report: RelayReport) -> str:
    line = (
        f"{report.table}: claimed {report.claimed}, sent {report.sent} (dedup hits {report.dedup_hits}), "
        f"retried {report.retried}, dead {report.dead}, conflicts {report.conflicts}, requeued {report.requeued} "
        f"in {report.seconds:.1f}s ({report.throughput:.0f} msg/s); stopped: {report.stopped_because}"
    )
    if report.dead_by_code:
        line += "; dead by code: " + by_code(report.dead_by_code)
    return line


def cmd_relay(args: argparse.Namespace) -> int:
    if args.group:
        return relay_group(args)
    settings = settings_of(args)
    table = settings.table(args.table)
    if not table.relay_enabled and not args.force:
        say(f"relay is disabled for {table.name} (OUTBOX_RELAY_ENABLED / relay_enabled); pass --force to run anyway")
        return EXIT_OK
    if args.batch_size:
        settings = replace(settings, tables={**settings.tables, table.name: replace(table, batch_size=args.batch_size)})
    url = database_url(schema_checked=False)  # run_table_relay checks it, on the connection of its owners check
    if args.metrics_port:
        serve_table_metrics(url, args, {table.name: table.relay_enabled})

    def started(relay: Relay) -> None:
        say(
            f"relaying {table.name} → {display_name(relay.destination.name)} as {relay.worker} "
            f"({table.mode}, batch {relay.table.batch_size})"
        )
        if table.delivers_nowhere:
            say(f"warning: {table.delivers_nowhere}")

    # The same function as the Dagster relay op: one way to run a relay.
    report = run_table_relay(
        url,
        settings,
        table.name,
        max_seconds=args.max_seconds,
        max_entries=args.max_entries,
        once=args.once,
        worker_id=args.worker_id,
        install_signal_handlers=True,
        progress=None if args.quiet else print_progress,
        relay_started=started,
    )
    if args.json:
        print(json.dumps(report.as_dict(), default=str))
    else:
        print(report_line(report))
    return EXIT_OK


def relay_group(args: argparse.Namespace) -> int:
    """``relay --group G``: every table of the group in this one process (what a Dagster group run does)."""
    if args.max_entries or args.batch_size or args.worker_id or args.force:
        raise UsageError(
            "--group takes --once or --max-seconds (and --quiet, --json, --metrics-port); --max-entries, "
            "--batch-size, --worker-id and --force are for one --table"
        )
    from outbox_pipelines.core.relay.group import run_group_relay
    from outbox_pipelines.core.settings.owners import without_tables_owned_elsewhere

    url = database_url()
    settings = without_tables_owned_elsewhere(url, settings_of(args))
    if args.metrics_port:
        names = settings.groups().get(args.group, [])
        serve_table_metrics(url, args, {name: settings.tables[name].relay_enabled for name in names})
    # This group's tables whose section cannot be used or that another project owns (another group's are its
    # relay's to tell): said now, so
    # that a long-running relay's log shows it from the start, and in the exit code (2) when the relay ends.
    left_out = settings.broken_in_group(args.group)
    exit_code = say_left_out(left_out)

    def started(group: "GroupRelay") -> None:
        say(f"relaying group {group.group}: {len(group.workers)} tables ({', '.join(sorted(group.workers))})")

    def progress(group: "GroupRelay") -> None:
        report = group.report()
        say(
            f"[group {report.group}] sent {report.sent}; active: "
            f"{', '.join(n for n, w in group.workers.items() if w.active) or 'none'}"
        )

    report = run_group_relay(
        url,
        settings,
        args.group,
        max_seconds=args.max_seconds,
        once=args.once,
        worker_prefix=f"{default_worker_id()}:{args.group}",
        install_signal_handlers=True,
        group_started=started,
        progress=None if args.quiet else progress,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "group": report.group,
                    "outcome": report.outcome,
                    "seconds": report.seconds,
                    "stopped_because": report.stopped_because,
                    "problems": report.problems,
                    "left_out": left_out,
                    "tables": {name: r.as_dict() for name, r in report.tables.items()},
                },
                default=str,
            )
        )
        return exit_code
    for table_report in report.tables.values():
        if table_report.claimed:
            print(report_line(table_report))
    for name, problem in sorted(report.problems.items()):
        print(f"{name}: cannot be relayed: {problem}")
    print(
        f"group {report.group}: {report.outcome}, sent {report.sent} in {report.seconds:.1f}s; "
        f"stopped: {report.stopped_because}"
    )
    return exit_code
