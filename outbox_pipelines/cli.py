"""outbox-pipelines: the command line of the outbox.

Exit codes: 0 done; 1 failed (database unreachable, migration error, ...);
2 bad input or usage (nothing was written).
"""

import argparse
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg

from outbox_pipelines.broker_faults import CONTROL_HELP, add_fault_options, faults_from_args
from outbox_pipelines.core.destinations.wiring import load_registry
from outbox_pipelines.core.enqueue import Outbox, check_message
from outbox_pipelines.core.errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidTableName,
    MigrationError,
    OutboxError,
    UnknownTable,
)
from outbox_pipelines.core.models import STATES, Message
from outbox_pipelines.core.oncall import metrics
from outbox_pipelines.core.oncall.health import TableStatus, read_status
from outbox_pipelines.core.operations.maintenance import (
    SHARED_NOT_DUE,
    clean_tables,
    requeue_stuck,
    shared_tables_cleaned,
)
from outbox_pipelines.core.operations.replay import (
    ReplayFilter,
    ReplayRefused,
    check_filter,
    check_row_id,
    parse_death_time,
    replay_dead,
)
from outbox_pipelines.core.operations.replay import iso as replay_iso
from outbox_pipelines.core.operations.replay import text_table as replay_text_table
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.relay import Relay, RelayReport, by_code, default_worker_id, run_table_relay
from outbox_pipelines.core.relay.destination_health import display_name
from outbox_pipelines.core.relay.group import GroupRelay, run_group_relay
from outbox_pipelines.core.relay.ordering import skip_dead_heads
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings, parse_duration
from outbox_pipelines.core.storage import db, migrate, roles, schema
from outbox_pipelines.core.storage.table import OutboxTable

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(OutboxError):
    pass


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _database_url() -> str:
    return db.resolve_database(announce=True).url


def _settings(args: argparse.Namespace) -> Settings:
    if getattr(args, "config", None):
        os.environ["OUTBOX_CONFIG"] = args.config
    # The project's own modules (its handlers) import from its root, as Dagster imports them from the
    # code location's working directory: a console script's sys.path does not hold the working directory.
    root = str(db.project_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    return load_settings()


def _chosen_tables(args: argparse.Namespace, settings: Settings) -> list[TableSettings]:
    """The tables named by --table (repeatable), else every usable table in name order; a table whose section
    cannot be used is then told at the end, and the command exits 2 (``main``)."""
    chosen = getattr(args, "table", None)
    if not chosen:
        args.unusable_tables = settings.broken
    return [settings.table(table_name) for table_name in (chosen or sorted(settings.tables))]


def _unusable_tables(args: argparse.Namespace) -> int:
    """Say which tables the command left out because their settings cannot be used: exit 2 if any."""
    broken: dict[str, str] = getattr(args, "unusable_tables", {})
    for name in sorted(broken):
        say(f"error: {name} was left out: {broken[name]}")
    return EXIT_USAGE if broken else EXIT_OK


def _row_id(value: str) -> int:
    try:
        return check_row_id(int(value))
    except ValueError as exc:  # ReplayRefused is a ValueError too
        message = str(exc) if isinstance(exc, ReplayRefused) else f"{value!r} is not a row id (a whole number)"
        raise argparse.ArgumentTypeError(message) from None


def _death_time(name: str) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            return parse_death_time(value, name)
        except ReplayRefused as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "time"
    return parse


def _duration(value: str) -> float:
    try:
        return parse_duration(value, "duration")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


# -- db ----------------------------------------------------------------------
def cmd_db_upgrade(args: argparse.Namespace) -> int:
    url = _database_url()
    applied = migrate.upgrade(url)
    if applied:
        for name in applied:
            print(f"applied {name}")
    else:
        print("database is up to date")
    return EXIT_OK


def cmd_db_create_table(args: argparse.Namespace) -> int:
    url = _database_url()
    if migrate.pending(url):
        raise UsageError("the database is not migrated yet: run 'outbox-pipelines db upgrade' first")
    created = schema.create_table(url, args.name, dedup_index=args.dedup)
    print(f"created outbox table {args.name}" if created
          else f"outbox table {args.name} already exists (checked its indexes and trigger)")
    if args.name not in _settings(args).tables:
        print(f"add a [tables.{args.name}] section to your outbox.toml (OUTBOX_CONFIG) to relay it")
    return EXIT_OK


GRANT_HELP = (
    "create the least-privilege group roles (NOLOGIN) and grant each its rights on the outbox tables: "
    f"{', '.join(roles.role_names())}. Run it as the tables' owner with CREATEROLE (or a superuser), after "
    "'db upgrade', and again after every 'db create-table' so the roles reach the new table; safe to repeat "
    "(each run revokes and grants the declared set). Then put each login role in its group, e.g. "
    "GRANT outbox_relay TO relay_login."
)


def cmd_db_grant(args: argparse.Namespace) -> int:
    url = _database_url()
    if migrate.pending(url):
        raise UsageError("the database is not migrated yet: run 'outbox-pipelines db upgrade' first")
    try:
        plan, statements = roles.grant_roles(url, dry_run=args.dry_run)
    except roles.GrantRefused as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except psycopg.errors.InsufficientPrivilege as exc:  # CREATE ROLE without CREATEROLE
        say(f"error: the database refused: {redact_text(str(exc).strip().splitlines()[0])}. Run 'db grant' as the "
            "owner of the outbox tables with CREATEROLE (or as a superuser), like 'db upgrade'.")
        return EXIT_FAILED
    if args.dry_run:
        print("\n".join(statements))
        print("-- dry run: nothing changed")
        return EXIT_OK
    if plan.missing_roles:
        print(f"created roles: {', '.join(plan.missing_roles)}")
    print(f"granted on schema {plan.schema} and its {len(plan.outbox_tables)} outbox tables "
          f"({', '.join(plan.outbox_tables) or 'none'}):")
    for spec in roles.all_roles():
        print(f"  {spec.name}: {spec.job}")
        for line in roles.rights(spec):
            print(f"      {line}")
    if plan.absent_tables:
        print(f"not in this database, skipped: {', '.join(plan.absent_tables)}")
    print("put each process's login role in its group (GRANT outbox_relay TO relay_login), and run "
          "'outbox-pipelines db grant' again after 'db create-table' so the roles reach the new table")
    return EXIT_OK


def cmd_db_url(args: argparse.Namespace) -> int:
    url = _database_url()
    print(url if args.show_password else db.mask_password(url))
    return EXIT_OK


def cmd_db_stop(args: argparse.Namespace) -> int:
    if os.environ.get(db.DATABASE_URL_ENV):
        raise UsageError("OUTBOX_DATABASE_URL is set: this command only stops the embedded server")
    root = db.embedded_dir()
    stopped = db.stop_embedded(root)
    print(f"stopped the embedded PostgreSQL under {root}" if stopped
          else f"no embedded PostgreSQL was running under {root}")
    return EXIT_OK


# -- enqueue -----------------------------------------------------------------
def _read_payload(raw: str) -> str:
    if raw == "-":
        return sys.stdin.read()
    if raw.startswith("@"):
        try:
            with open(raw[1:], encoding="utf-8") as handle:
                return handle.read()
        except OSError as exc:
            raise UsageError(f"cannot read payload file {raw[1:]}: {exc.strerror}") from None
    return raw


def cmd_enqueue(args: argparse.Namespace) -> int:
    settings = _settings(args)
    table = settings.table(args.table)
    headers: dict[str, Any] = {}
    for item in args.header or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--header {item!r}: write it as key=value")
        headers[key] = value
    if args.trace_id:
        headers["trace_id"] = args.trace_id
    message = Message(
        topic=args.topic,
        payload=_read_payload(args.payload),
        event_id=args.event_id,
        tenant_id=args.tenant,
        headers=headers,
        ordering_key=args.ordering_key,
    )
    check_message(message)  # bad input exits 2 before the database is even reached
    if table.destination == "handlers" and not args.allow_unknown_topic:
        registry = load_registry(table.handlers or "")
        if not registry.handlers_for(args.topic):
            known = ", ".join(registry.topics) or "none"
            raise UsageError(
                f"no handler for topic {args.topic!r} on {table.name} (known topics: {known}); "
                "nothing was enqueued. Pass --allow-unknown-topic to enqueue it anyway."
            )
    url = _database_url()
    with db.connect(url, autocommit=False) as conn:
        result = Outbox(table.name).enqueue(conn, message)
        conn.commit()
    if args.json:
        print(json.dumps({"id": result.id, "event_id": result.event_id, "duplicate": result.duplicate,
                          "same_payload": result.same_payload}))
    elif result.duplicate:
        note = "" if result.same_payload else " (the stored payload differs from this one; it was kept)"
        print(f"duplicate: event {result.event_id} is already row {result.id} in {table.name}{note}")
    else:
        print(f"enqueued row {result.id} (event {result.event_id}) in {table.name}")
    return EXIT_OK


# -- status ------------------------------------------------------------------
def _print_destination_health(r: TableStatus) -> None:
    health = r.destination
    if health is None:
        return
    if health.failing:
        codes = ", ".join(f"{c}={n}" for c, n in health.error_codes.items())
        print(f"\n{r.table}: deliveries to {health.destination} have failed for "
              f"{_fmt_s(health.failing_for_s)} ({codes}); messages retry by themselves")
    if health.circuit_opened_at is not None:
        print(f"{r.table}: circuit open since {health.circuit_opened_at:%Y-%m-%d %H:%M:%S %Z}: one probe "
              "message at a time, no attempts spent; it closes on the first success")
    if health.paused:
        print(f"{r.table}: paused {_fmt_s(health.paused_for_s)} more: the destination asked to slow down (429)")
    if health.relay_problem:
        since = f" since {health.relay_problem_since:%Y-%m-%d %H:%M:%S %Z}" if health.relay_problem_since else ""
        print(f"{r.table}: cannot be relayed{since}: {health.relay_problem}")


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = _database_url()
    reports = []
    missing: list[str] = []  # declared, not created yet: told at the end, the others shown
    chosen = _chosen_tables(args, settings)
    with db.connect(url) as conn:
        for table in chosen:
            try:
                reports.append(read_status(OutboxTable(conn, table.name), stuck_after_s=table.stuck_threshold_s,
                                           count_sent=True))
            except UnknownTable:
                missing.append(table.name)
    tables = [t for t in chosen if t.name not in missing]
    _print_status(args, reports, tables)
    if missing:
        say(f"not in the database yet: {', '.join(missing)}. Run 'outbox-pipelines db create-table NAME' for each "
            "(or 'outbox-pipelines db upgrade' for the shipped tables)")
        return EXIT_FAILED
    return EXIT_OK


def _print_status(args: argparse.Namespace, reports: list[TableStatus], tables: list[TableSettings]) -> None:
    if args.json:
        print(json.dumps([{**r.as_dict(), "delivers_nowhere": t.delivers_nowhere} for r, t in zip(reports, tables,
                                                                                                   strict=True)],
                         indent=2, default=str))
        return
    width = max([18, *(len(r.table) + 1 for r in reports)])
    header = (f"{'table':<{width}}" + "".join(f"{s:>10}" for s in STATES)
              + f"{'stuck':>8}{'oldest':>9}{'lag p50':>9}{'p95':>8}{'p99':>8}")
    print(header)
    for r in reports:
        print(
            f"{r.table:<{width}}" + "".join(f"{r.counts.get(s, 0):>10}" for s in STATES) + f"{r.stuck:>8}"
            f"{_fmt_s(r.oldest_pending_age_s):>9}{_fmt_s(r.lag_p50_s):>9}{_fmt_s(r.lag_p95_s):>8}{_fmt_s(r.lag_p99_s):>8}"
        )
    dead = [(r.table, code, n) for r in reports for code, n in r.dead_by_code.items()]
    if dead:
        print("\ndead by error code:")
        for table_name, code, n in dead:
            print(f"  {table_name:<18} {code:<22} {n}")
        print("\nto look at dead rows (changes nothing; drop --dry-run to replay them):")
        for command in _status_replay_suggestions(args, reports):
            print(f"  {command}")
    print(f"\nlag = created → delivered over the last {_fmt_s(reports[0].lag_window_s if reports else 3600)}, "
          "messages still waiting counted with their age so far; "
          "oldest = age of the oldest message not yet delivered (retries in backoff included), from its creation\n"
          "the lag check grades what waits now instead: the p95 and the oldest of the messages due and not yet "
          "delivered, each from when it became due (a retry when its backoff ends, a replay at the replay); "
          "nothing waiting passes")
    for r in reports:
        _print_destination_health(r)
    for r in reports:
        if r.blocked_keys:
            print(f"\n{blocked_keys_text(r)}")
            for command in _blocked_key_suggestions(args, r):
                print(f"  {command}")
    for table in tables:
        if table.delivers_nowhere:
            print(f"\n{table.delivers_nowhere}")


def blocked_keys_text(r: Any) -> str:
    which = ", ".join(f"{k['key']} (id {k['id']})" for k in r.blocked_oldest)
    more = f" and {r.blocked_keys - len(r.blocked_oldest)} more" if r.blocked_keys > len(r.blocked_oldest) else ""
    return (f"{r.table}: {r.blocked_keys} ordering key{'' if r.blocked_keys == 1 else 's'} blocked since "
            f"{r.blocked_since:%Y-%m-%d %H:%M:%S %Z} by a dead message; {r.blocked_messages} later "
            f"message{'' if r.blocked_messages == 1 else 's'} wait behind: {which}{more}. Replay the dead message "
            "(its key then goes on in order), or skip it (the rest of its key goes without it):")


def _blocked_key_suggestions(args: argparse.Namespace, r: Any) -> list[str]:
    prefix = shlex.join(["outbox-pipelines"] + (["--config", args.config] if getattr(args, "config", None) else []))
    first = r.blocked_oldest[0]["id"]
    return [f"{prefix} replay --table {r.table} --id {first} --dry-run",
            f"{prefix} skip --table {r.table} --id {first} --dry-run"]


def _status_replay_suggestions(args: argparse.Namespace, reports: list[Any]) -> list[str]:
    """Replay commands that run as printed: per table with dead rows, its commonest code, and --all."""
    prefix = ["outbox-pipelines"] + (["--config", args.config] if getattr(args, "config", None) else [])
    commands = []
    for r in reports:
        if not r.dead_by_code:
            continue
        code = max(r.dead_by_code.items(), key=lambda item: (item[1], item[0]))[0]
        base = prefix + ["replay", "--table", r.table]
        commands.append(shlex.join(base + ["--error-code", code, "--dry-run"]))
        if len(r.dead_by_code) > 1:
            commands.append(shlex.join(base + ["--all", "--dry-run"]))
    return commands


# -- relay -------------------------------------------------------------------
def _print_progress(report: RelayReport) -> None:
    say(f"[{report.table}] {report.seconds:.0f}s: {report.progress_line()}")


def _report_line(report: RelayReport) -> str:
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
        return _relay_group(args)
    settings = _settings(args)
    table = settings.table(args.table)
    if not table.relay_enabled and not args.force:
        say(f"relay is disabled for {table.name} (OUTBOX_RELAY_ENABLED / relay_enabled); pass --force to run anyway")
        return EXIT_OK
    if args.batch_size:
        settings = replace(settings, tables={**settings.tables, table.name: replace(table, batch_size=args.batch_size)})
    url = _database_url()
    if args.metrics_port:
        metrics.watch_tables(url, [table.name])
        metrics.serve(args.metrics_port)
        say(f"Prometheus metrics on http://127.0.0.1:{args.metrics_port}/metrics")

    def started(relay: Relay) -> None:
        say(f"relaying {table.name} → {display_name(relay.destination.name)} as {relay.worker} "
            f"({table.mode}, batch {relay.table.batch_size})")
        if table.delivers_nowhere:
            say(f"warning: {table.delivers_nowhere}")

    # The same function as the Dagster relay op: one way to run a relay.
    report = run_table_relay(url, settings, table.name, max_seconds=args.max_seconds, max_entries=args.max_entries,
                             once=args.once, worker_id=args.worker_id, install_signal_handlers=True,
                             progress=None if args.quiet else _print_progress, relay_started=started)
    if args.json:
        print(json.dumps(report.as_dict(), default=str))
    else:
        print(_report_line(report))
    return EXIT_OK


def _relay_group(args: argparse.Namespace) -> int:
    """``relay --group G``: every table of the group in this one process (what a Dagster group run does)."""
    if args.max_entries or args.batch_size or args.worker_id or args.metrics_port or args.force:
        raise UsageError("--group takes --once or --max-seconds (and --quiet, --json); --max-entries, --batch-size, "
                         "--worker-id, --metrics-port and --force are for one --table")
    settings = _settings(args)
    url = _database_url()

    def started(group: GroupRelay) -> None:
        say(f"relaying group {group.group}: {len(group.workers)} tables ({', '.join(sorted(group.workers))})")

    def progress(group: GroupRelay) -> None:
        report = group.report()
        say(f"[group {report.group}] sent {report.sent}; active: "
            f"{', '.join(n for n, w in group.workers.items() if w.active) or 'none'}")

    report = run_group_relay(url, settings, args.group, max_seconds=args.max_seconds, once=args.once,
                             worker_prefix=f"{default_worker_id()}:{args.group}", install_signal_handlers=True,
                             group_started=started, progress=None if args.quiet else progress)
    if args.json:
        print(json.dumps({"group": report.group, "outcome": report.outcome, "seconds": report.seconds,
                          "stopped_because": report.stopped_because, "problems": report.problems,
                          "tables": {name: r.as_dict() for name, r in report.tables.items()}}, default=str))
        return EXIT_OK
    for table_report in report.tables.values():
        if table_report.claimed:
            print(_report_line(table_report))
    for name, problem in sorted(report.problems.items()):
        print(f"{name}: cannot be relayed: {problem}")
    print(f"group {report.group}: {report.outcome}, sent {report.sent} in {report.seconds:.1f}s; "
          f"stopped: {report.stopped_because}")
    return EXIT_OK


# -- maintenance -------------------------------------------------------------
def cmd_requeue_stuck(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = _database_url()
    for table in _chosen_tables(args, settings):
        if args.threshold is not None:
            table = replace(table, stuck_threshold_s=args.threshold)
        report = requeue_stuck(url, table, progress=say)
        released = f", ordering keys released {report.keys_released}" if report.keys_released else ""
        print(f"{table.name}: requeued {report.requeued}, dead (no attempts left) {report.dead}{released}")
    return EXIT_OK


def cmd_clean(args: argparse.Namespace) -> int:
    # The run's rules (which tables, the retention check before any delete, --force, the shared tables) are
    # clean_tables'; this prints its report.
    report = clean_tables(_database_url, _chosen_tables(args, _settings(args)), retention_s=args.retention,
                          audit_retention_s=args.audit_retention, force=args.force, tenant_id=args.tenant,
                          progress=say)
    whose = f" of tenant {args.tenant}" if args.tenant else ""
    for outcome in report.tables:
        older = f"older than {_fmt_s(outcome.retention_s)}"
        print(f"{outcome.table}: {outcome.skipped or f'deleted {outcome.deleted_sent} sent rows{whose} {older}'}")
    if report.shared is None:
        print(f"{', '.join(shared_tables_cleaned())}: {SHARED_NOT_DUE}")
    else:
        lines = [f"{table}: deleted {n} expired rows" for table, n in report.shared.deleted_expired.items()]
        lines += [f"outbox_audit: deleted {report.shared.deleted_audit} old rows"] if args.audit_retention else []
        print("; ".join(lines))
    return EXIT_OK


def _applied_time(value: datetime | timedelta | None) -> str | None:
    """A since/until of the report's selection: replay_dead resolved "that long ago" into a time."""
    if isinstance(value, timedelta):
        raise TypeError("replay_dead reports its filter with the times resolved")
    return replay_iso(value)


def _replay_command(args: argparse.Namespace, selection: ReplayFilter, *, dry_run: bool) -> str:
    """The replay command line for this filter (times as applied), so it can be pasted as printed."""
    parts = ["outbox-pipelines"] + (["--config", args.config] if getattr(args, "config", None) else [])
    parts += ["replay", "--table", args.table]
    for row_id in selection.ids or ():
        parts += ["--id", str(row_id)]
    for flag, value in (("--topic", selection.topic), ("--tenant", selection.tenant_id),
                        ("--error-code", selection.error_code), ("--since", _applied_time(selection.since)),
                        ("--until", _applied_time(selection.until))):
        if value is not None:
            parts += [flag, value]
    if selection.is_empty():
        parts.append("--all")
    if args.force:
        parts.append("--force")
    if dry_run:
        parts.append("--dry-run")
    return shlex.join(parts)


def cmd_replay(args: argparse.Namespace) -> int:
    settings = _settings(args)
    table = settings.table(args.table)
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
        report = replay_dead(_database_url(), table.name, selection, dry_run=args.dry_run, force=args.force,
                             allow_all=args.all, actor=f"cli:{os.environ.get('USER', 'operator')}")
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
            print(f"\ndry run: nothing changed. To replay these rows, run:\n  "
                  f"{_replay_command(args, report.selection, dry_run=False)}")
        else:
            print("\ndry run: nothing changed.")
    return EXIT_OK


def cmd_skip(args: argparse.Namespace) -> int:
    table = _settings(args).table(args.table)
    report = skip_dead_heads(_database_url(), table, ids=args.id, ordering_key=args.key, dry_run=args.dry_run,
                             worker=f"cli:{os.environ.get('USER', 'operator')}",
                             reason=args.reason or "skipped by an operator")
    if args.json:
        print(json.dumps({"table": table.name, "dry_run": report.dry_run, "skipped": report.skipped,
                          "matched": [{"id": i, "ordering_key": k, "error_code": c} for i, k, c in report.matched]},
                         indent=2))
        return EXIT_OK
    verb = "would skip" if report.dry_run else "skipped"
    for row_id, key, code in report.matched:
        print(f"  {verb} id {row_id} (key {key}, died of {code or 'UNKNOWN'})")
    print(report.summary)
    return EXIT_OK


# -- demo --------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from outbox_pipelines.demo import run_demo  # Dagster: only for this command

    return run_demo(_database_url(), quiet=args.quiet)


def cmd_order_api(args: argparse.Namespace) -> int:
    # Imported here: the API's server stack (Starlette, uvicorn, tracing) adds ~0.2 s to every command.
    from outbox_pipelines.orders.api.server import prepare, serve

    url = _database_url()
    prepare(url, args.host, allow_anonymous=args.allow_anonymous)  # a refused start touches nothing
    applied = migrate.upgrade(url)
    if applied:
        say(f"migrated the database: {', '.join(applied)}")
    return serve(url, args.host, args.port, allow_anonymous=args.allow_anonymous, say=say)


def cmd_broker_sim(args: argparse.Namespace) -> int:
    from aiohttp import web  # the server stack: only for this command, so a relay starts faster

    from outbox_pipelines.broker_sim import BrokerSim

    faults = faults_from_args(args)
    sim = BrokerSim(faults, host=args.host, port=args.port)
    say(f"broker simulator on http://{args.host}:{args.port}/orders (any path works; Ctrl-C stops it); "
        f"faults: {faults.describe()}")
    web.run_app(sim.app(), host=args.host, port=args.port, print=None, access_log=None)
    return EXIT_OK


def cmd_dev(args: argparse.Namespace) -> int:
    from outbox_pipelines.dev import run_dev  # Dagster: only for this command

    return run_dev(host=args.host, port=args.port, allow_remote=args.allow_remote, verbose=args.verbose)


# -- parser ------------------------------------------------------------------
Handler = Callable[[argparse.Namespace], int]


def _command(sub: Any, name: str, handler: Handler, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text, **kwargs)
    p.set_defaults(handler=handler)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox-pipelines",
        description=(
            "Transactional outbox for PostgreSQL. Uses OUTBOX_DATABASE_URL, or an embedded PostgreSQL "
            "under the project's .outbox/ when it is unset (the nearest directory up from here holding "
            "pyproject.toml, outbox.toml or .outbox). Table settings come from OUTBOX_CONFIG, else the project's "
            "outbox.toml, else its OutboxComponent's defs.yaml (dg scaffold defs outbox_pipelines.OutboxComponent)."
        ),
        epilog="Exit codes: 0 done, 1 failed, 2 bad input or usage (nothing written).",
    )
    parser.add_argument("--config", help="table settings file (TOML); default: $OUTBOX_CONFIG, else the project's "
                        "outbox.toml or OutboxComponent defs.yaml")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the relay does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_db_commands(sub)
    _add_message_commands(sub)
    _add_maintenance_commands(sub)
    _add_service_commands(sub)
    return parser


def _add_db_commands(sub: Any) -> None:
    dbp = sub.add_parser("db", help="schema: upgrade, create-table, grant, url, stop",
                         description="Database schema and the embedded server.")
    dbsub = dbp.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    p = dbsub.add_parser("upgrade", help="apply the migrations in sql/migrations (safe to repeat, safe in parallel)")
    p.set_defaults(handler=cmd_db_upgrade)
    p = dbsub.add_parser("create-table", help="create another outbox table of the canonical shape")
    p.add_argument("name", help="table name: lowercase letters, digits, _ (e.g. hrm_outbox)")
    p.add_argument("--dedup", action="store_true", help="add the index that makes (topic, payload_sha) dedup fast")
    p.set_defaults(handler=cmd_db_create_table)
    p = dbsub.add_parser("grant", help="create the least-privilege database roles and grant their rights "
                         "(re-run after create-table)", description=GRANT_HELP)
    p.add_argument("--dry-run", action="store_true", help="print the SQL it would run; change nothing")
    p.set_defaults(handler=cmd_db_grant)
    p = dbsub.add_parser(
        "url", help="print the database URL in use, its password masked (starts the embedded server if needed)")
    p.add_argument("--show-password", action="store_true",
                   help="print the password too (for scripts; keep it off screens and logs)")
    p.set_defaults(handler=cmd_db_url)
    p = dbsub.add_parser("stop", help="stop the project's embedded PostgreSQL (under its .outbox/)")
    p.set_defaults(handler=cmd_db_stop)


def _add_message_commands(sub: Any) -> None:
    """enqueue, status, relay and replay."""
    add = partial(_command, sub)

    p = add("enqueue", cmd_enqueue, "enqueue one message (in its own transaction)")
    p.add_argument("--table", required=True, help="outbox table, e.g. outbox_events")
    p.add_argument("--topic", required=True, help="message topic / event type")
    p.add_argument("--payload", required=True, help="JSON object, @file.json, or - for stdin")
    p.add_argument("--event-id", help="idempotency key (default: a new UUID)")
    p.add_argument("--tenant", help="tenant id")
    p.add_argument("--ordering-key", metavar="KEY",
                   help="deliver after every earlier message of this key, one at a time (the aggregate: order-42)")
    p.add_argument("--trace-id", help="trace id, stored in the headers")
    p.add_argument("--header", action="append", metavar="KEY=VALUE", help="extra header (repeatable)")
    p.add_argument("--allow-unknown-topic", action="store_true", help="enqueue even if no handler knows the topic")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = add("status", cmd_status, "per table: rows per state, stuck, oldest pending age, lag p50/p95/p99, dead by code")
    p.add_argument("--table", action="append", help="only this table (repeatable); default: every configured table")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("relay", cmd_relay, "run a relay worker: claim, dispatch, settle", epilog=(
        "Behind a transaction pooler (PgBouncer) set OUTBOX_DIRECT_DATABASE_URL to a direct connection: the "
        "relay's session (LISTEN wake-ups, the single-active lock) needs one. Without it a competing table's "
        "relay polls, and a single-active table's relay refuses to start."))
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--table", help="outbox table to relay")
    which.add_argument("--group", help="relay every table of this relay group in one process, each on a worker of "
                                       "its own ('default' unless outbox.toml gives a table another group)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--once", action="store_true", help="drain what is ready now, then exit")
    budget.add_argument("--max-seconds", type=float, metavar="S",
                        help="stop claiming after S seconds (finishes the batch in flight)")
    p.add_argument("--max-entries", type=int, metavar="N", help="stop after claiming N messages")
    p.add_argument("--batch-size", type=int, help="messages per claim (default: table setting / OUTBOX_BATCH_SIZE)")
    p.add_argument("--worker-id", help="lease holder name (default: host:pid:random)")
    p.add_argument("--force", action="store_true", help="run even if the relay is disabled for the table")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics on 127.0.0.1:PORT")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")

    p = add("replay", cmd_replay, "move dead messages back to pending (attempts reset), by filter")
    p.add_argument("--table", required=True, help="outbox table, e.g. outbox_orders")
    p.add_argument("--id", type=_row_id, action="append", metavar="ID", help="row id (repeatable)")
    p.add_argument("--topic", help="only rows of this topic")
    p.add_argument("--tenant", help="only rows of this tenant id")
    p.add_argument("--error-code", metavar="CODE",
                   help="only rows that died with this code, any case: e.g. BROKER_5XX, NETWORK_TIMEOUT, UNAUTHORIZED "
                        "(UNKNOWN = no code; 'outbox-pipelines status' lists the codes of dead rows)")
    p.add_argument("--since", type=_death_time("since"), metavar="TIME",
                   help="died at or after TIME: ISO 8601 like 2026-11-21T10:00:00Z (UTC if no offset), a date "
                        "like 2026-11-21, or a time ago like 30m, 2h, 7d")
    p.add_argument("--until", type=_death_time("until"), metavar="TIME",
                   help="died before TIME (same formats as --since)")
    p.add_argument("--all", action="store_true", help="every dead row of the table (needed when no filter is given)")
    p.add_argument("--dry-run", action="store_true", help="list what would be replayed; change nothing")
    p.add_argument("--force", action="store_true", help="also replay rows that died of BAD_REQUEST")
    p.add_argument("--json", action="store_true", help="print the report as JSON (rows, counts, filter)")

    p = add("skip", cmd_skip, "pass over a dead message that blocks its ordering key: the rest of the key goes on",
            epilog="The message stays dead (replay it later and it goes out unordered); the skip is audited "
                   "(outbox_skip). Under ordering = \"park\" (the default) a dead message blocks the later "
                   "messages of its key until it is replayed or skipped.")
    p.add_argument("--table", required=True, help="outbox table")
    p.add_argument("--id", type=_row_id, action="append", metavar="ID", help="the dead message's row id (repeatable)")
    p.add_argument("--key", metavar="KEY", help="every parked dead message of this ordering key")
    p.add_argument("--reason", help="why, kept in the audit row")
    p.add_argument("--dry-run", action="store_true", help="list what would be skipped; change nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_maintenance_commands(sub: Any) -> None:
    add = partial(_command, sub)

    p = add("requeue-stuck", cmd_requeue_stuck,
            "return sending rows with an expired lease (or stuck past the threshold) to pending")
    p.add_argument("--table", action="append", help="only this table (repeatable)")
    p.add_argument("--threshold", type=_duration,
                   help="stuck after this long in sending (default OUTBOX_STUCK_THRESHOLD_MIN)")

    p = add("clean", cmd_clean, "delete sent rows older than the retention, and expired ledger rows")
    p.add_argument("--table", action="append", help="only this table (repeatable)")
    p.add_argument("--retention", type=_duration,
                   help="keep sent rows this long (default OUTBOX_CLEANER_RETENTION, 168h)")
    p.add_argument("--audit-retention", type=_duration, help="also delete audit rows older than this")
    p.add_argument("--tenant", help="only this tenant's sent rows (expired ledger rows are cleaned regardless)")
    p.add_argument("--force", action="store_true",
                   help="run even if the cleaner is disabled, and accept a retention shorter than the table's dedup "
                        "horizon (at least 1h; sent rows are what dedups a repeated event_id or payload)")


def _add_service_commands(sub: Any) -> None:
    """The Order API, the broker simulator, the Dagster dev stack and the demo."""
    add = partial(_command, sub)

    p = add("order-api", cmd_order_api, "serve the Order API (POST /do/order) with its idempotency ledger")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--allow-anonymous", action="store_true",
                   help="serve without OUTBOX_API_TOKEN on a non-loopback --host (anyone who reaches it can "
                        "place orders)")

    p = add("broker-sim", cmd_broker_sim,
            "a local broker that executes each idempotency key once, with fault injection",
            epilog=CONTROL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_fault_options(p)

    p = add("dev", cmd_dev,
            "start the Dagster UI and daemon on the outbox (embedded default), with schedules and sensors on; "
            "Dagster's ticks that found nothing to do are left out of the terminal (outbox-pipelines -v dev "
            "shows them)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve the UI on (default 127.0.0.1); one other than loopback needs --allow-remote")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--allow-remote", action="store_true",
                   help="serve the UI on a non-loopback --host: it has no login, so anyone who reaches it can launch "
                        "runs (put an authenticating proxy in front; docs/deploy.md)")

    p = add("demo", cmd_demo, "run the outbox end to end on the embedded default and print what happened")
    p.add_argument("--quiet", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # Handler modules an outbox.toml names next to it import as under `python -m` (the console
    # script alone does not put the working directory on the path).
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return int(args.handler(args) or 0) or _unusable_tables(args)
    except (UsageError, InvalidMessage, InvalidTableName, UnknownTable, ConfigError) as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except (DatabaseUnavailable, MigrationError) as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except psycopg.Error as exc:
        if args.verbose:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        say(f"error: the database refused: {redact_text(first)} (rerun with -v for the traceback)")
        return EXIT_FAILED
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
