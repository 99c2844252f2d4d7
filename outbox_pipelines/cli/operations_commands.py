"""The operator's repairs on rows: ``requeue-stuck``, ``clean``, ``replay`` and ``skip``. The rules (which rows,
the retention and filter checks, the audit) are the operations and relay rooms', shared with Dagster's jobs;
these pass the command's options and print the reports, with the command to run next where there is one."""

import argparse
import json
import os
import shlex
from dataclasses import replace
from datetime import datetime, timedelta

from outbox_pipelines.cli.inputs import chosen_tables, database_url, settings_of
from outbox_pipelines.cli.output import EXIT_OK, UsageError, command_prefix, say
from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.operations.maintenance import (
    SHARED_NOT_DUE,
    check_stuck_threshold,
    clean_tables,
    requeue_stuck,
    shared_tables_cleaned,
)
from outbox_pipelines.core.operations.replay import ReplayFilter, ReplayRefused, check_filter, replay_dead
from outbox_pipelines.core.operations.replay import iso as replay_iso
from outbox_pipelines.core.operations.replay import text_table as replay_text_table
from outbox_pipelines.core.relay.ordering import skip_dead_heads


def operator() -> str:
    """Who did it, for the audit rows: the CLI and the login that ran it."""
    return f"cli:{os.environ.get('USER', 'operator')}"


def cmd_requeue_stuck(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    tables = chosen_tables(args, settings)
    if args.threshold is not None:
        for table in tables:  # every table checked before any is changed
            check_stuck_threshold(table, args.threshold, force=args.force)
        tables = [replace(table, stuck_threshold_s=args.threshold) for table in tables]
    url = database_url()
    for table in tables:
        report = requeue_stuck(url, table, progress=say)
        released = f", ordering keys released {report.keys_released}" if report.keys_released else ""
        print(f"{table.name}: requeued {report.requeued}, dead (no attempts left) {report.dead}{released}")
    return EXIT_OK


def cmd_clean(args: argparse.Namespace) -> int:
    # The run's rules (which tables, the retention check before any delete, --force, the shared tables) are
    # clean_tables'; this prints its report.
    settings = settings_of(args)
    report = clean_tables(
        database_url,
        chosen_tables(args, settings),
        retention_s=args.retention,
        audit_retention_s=args.audit_retention,
        force=args.force,
        tenant_id=args.tenant,
        progress=say,
        inboxes=[] if args.table else [settings.inboxes[name] for name in sorted(settings.inboxes)],
    )
    whose = f" of tenant {args.tenant}" if args.tenant else ""
    for outcome in report.tables:
        older = f"older than {duration_words(outcome.retention_s)}"
        dead = f", {outcome.deleted_dead} dead rows past their retention" if outcome.deleted_dead else ""
        print(f"{outcome.table}: {outcome.skipped or f'deleted {outcome.deleted_sent} sent rows{whose} {older}{dead}'}")
    if report.shared is None:
        print(f"{', '.join(shared_tables_cleaned())}: {SHARED_NOT_DUE}")
    else:
        lines = [f"{table}: deleted {n} expired rows" for table, n in report.shared.deleted_expired.items()]
        lines += [f"outbox_audit: deleted {report.shared.deleted_audit} old rows"]
        print("; ".join(lines))
    for name, deleted in report.inboxes.items():  # docs/how-to/inbox.md
        window = duration_words(settings.inboxes[name].window_s)
        print(f"{name}: deleted {deleted} inbox entries older than {window} (its window)")
    for name, why in report.inboxes_skipped.items():
        print(f"{name}: {why}")
    return EXIT_OK


def applied_time(value: datetime | timedelta | None) -> str | None:
    """A since/until of the report's selection: replay_dead resolved "that long ago" into a time."""
    if isinstance(value, timedelta):
        raise TypeError("replay_dead reports its filter with the times resolved")
    return replay_iso(value)


def replay_command(args: argparse.Namespace, selection: ReplayFilter, *, dry_run: bool) -> str:
    """The replay command line for this filter (times as applied), so it can be pasted as printed."""
    parts = command_prefix(args) + ["replay", "--table", args.table]
    for row_id in selection.ids or ():
        parts += ["--id", str(row_id)]
    for flag, value in (
        ("--topic", selection.topic),
        ("--tenant", selection.tenant_id),
        ("--error-code", selection.error_code),
        ("--since", applied_time(selection.since)),
        ("--until", applied_time(selection.until)),
    ):
        if value is not None:
            parts += [flag, value]
    if selection.is_empty():
        parts.append("--all")
    if args.force:
        parts.append("--force")
    if args.reason:
        parts += ["--reason", args.reason]
    if dry_run:
        parts.append("--dry-run")
    return shlex.join(parts)


def cmd_replay(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    table = settings.for_operations(args.table)  # a replay delivers nothing itself
    selection = ReplayFilter(
        ids=tuple(args.id) if args.id else None,
        topic=args.topic,
        tenant_id=args.tenant,
        error_code=args.error_code,
        since=args.since,
        until=args.until,
    )
    try:
        check_filter(selection, allow_all=args.all)  # the core's rule, the Dagster launch's too: before a database
        report = replay_dead(
            database_url(),
            table.name,
            selection,
            dry_run=args.dry_run,
            force=args.force,
            allow_all=args.all,
            actor=operator(),
            reason=args.reason or "",
        )
    except ReplayRefused as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return EXIT_OK
    print(f"filter: {report.filter}")
    print(report.summary)
    if report.matched == 0:
        print("no dead rows match the filter (see 'outbox-pipelines status' for dead rows by error code)")
        return EXIT_OK
    if report.would_replay:
        verb = "would replay" if report.dry_run else "replayed"
        print(f"\n{verb} ({report.would_replay}):")
        print(replay_text_table(report.rows, report.would_replay))
    if report.refused:
        print(f"\nrefused, died of BAD_REQUEST ({report.refused}; --force replays them):")
        print(replay_text_table(report.refused_rows, report.refused))
    if report.dry_run:
        if report.would_replay:
            print(
                "\ndry run: nothing changed. To replay these rows, run:\n  "
                f"{replay_command(args, report.selection, dry_run=False)}"
            )
        else:
            print("\ndry run: nothing changed.")
    return EXIT_OK


def cmd_skip(args: argparse.Namespace) -> int:
    table = settings_of(args).for_operations(args.table)
    report = skip_dead_heads(
        database_url(),
        table,
        ids=args.id,
        ordering_key=args.key,
        dry_run=args.dry_run,
        worker=operator(),
        reason=args.reason or "skipped by an operator",
    )
    if args.json:
        print(
            json.dumps(
                {
                    "table": table.name,
                    "dry_run": report.dry_run,
                    "skipped": report.skipped,
                    "matched": [{"id": i, "ordering_key": k, "error_code": c} for i, k, c in report.matched],
                },
                indent=2,
            )
        )
        return EXIT_OK
    verb = "would skip" if report.dry_run else "skipped"
    for row_id, key, code in report.matched:
        print(f"  {verb} id {row_id} (key {key}, died of {code or 'UNKNOWN'})")
    print(report.summary)
    return EXIT_OK
