"""``outbox-pipelines status``: the on-call's view of each table (rows per state, stuck, age of the oldest,
lag, dead rows by code, the destination's health, blocked ordering keys), with the commands to run next.
The figures are the on-call room's (``core.oncall.health.read_status``); this lays them out."""

import argparse
import json
import shlex
from typing import Any

from outbox_pipelines.cli.inputs import chosen_tables, database_url, settings_of
from outbox_pipelines.cli.output import EXIT_FAILED, EXIT_OK, command_prefix, say, shell_prefix
from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.errors import NotAnOutboxTable, UnknownTable
from outbox_pipelines.core.models import STATES
from outbox_pipelines.core.oncall.checks import while_failing
from outbox_pipelines.core.oncall.database_health import vacuum_verdicts
from outbox_pipelines.core.oncall.health import TableStatus
from outbox_pipelines.core.oncall.lock_holders import holders_text
from outbox_pipelines.core.oncall.table_status import read_table_status, undeclared_tables
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.settings import URL_FROM_ENV, TableSettings
from outbox_pipelines.core.storage import db
from outbox_pipelines.core.storage.paused_topics import paused_text

LAG_LEGEND = (
    "messages still waiting counted with their age so far; "
    "oldest = age of the oldest message not yet delivered (retries in backoff included), from its creation\n"
    "the lag check grades what waits now instead: the p95 and the oldest of the messages due and not yet "
    "delivered, each from when it became due (a retry when its backoff ends, a replay at the replay); "
    "nothing waiting passes"
)


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    url = database_url()
    reports = []
    missing: list[str] = []  # declared, not created yet: told at the end, the others shown
    not_outboxes: dict[str, str] = {}  # declared, but the name is a table of another kind: told at the end too
    chosen = chosen_tables(args, settings)
    undeclared: list[TableStatus] = []
    with db.connect(url) as conn:
        for table in chosen:
            try:
                reports.append(read_table_status(conn, table, count_sent=True))
            except NotAnOutboxTable as exc:
                not_outboxes[table.name] = str(exc)
            except UnknownTable:
                missing.append(table.name)
        if not args.table:
            undeclared = undeclared_tables(conn, [*settings.tables, *settings.broken], settings.project)
        vacuum = vacuum_verdicts(conn, settings, [r.table for r in reports]) if reports and not args.json else {}
    tables = [t for t in chosen if t.name not in missing and t.name not in not_outboxes]
    print_status(args, reports, tables)
    if vacuum:  # the database side (core/oncall/database_health.py)
        print("\nvacuum (dead tuples, size, what holds vacuum back):")
        print("\n".join(f"  {v.severity.upper():<5} {v.description}" for v in vacuum.values()))
    if undeclared and not args.json:
        say_undeclared(undeclared)
    for why in not_outboxes.values():
        say(f"error: {why}")
    if missing:
        say(
            f"not in the database yet: {', '.join(missing)}. Run 'outbox-pipelines db upgrade' as the tables' "
            "owner: it creates every table the project declares ('db create-table NAME' creates one)"
        )
    if missing or not_outboxes:
        return EXIT_FAILED
    return EXIT_OK


def say_undeclared(undeclared: list[TableStatus]) -> None:
    """The outbox tables in the database this project does not declare: their messages wait for nobody here."""
    listed = ", ".join(f"{status.table} ({status.waiting} waiting)" for status in undeclared)
    print(
        f"\nin the database but declared nowhere in this project: {listed}. No relay of this project delivers "
        "their messages: declare each in outbox.toml or the OutboxComponent's defs.yaml if it is this project's, "
        "or leave it to the project that declares it."
    )


def print_status(args: argparse.Namespace, reports: list[TableStatus], tables: list[TableSettings]) -> None:
    if args.json:
        print(
            json.dumps(
                [{**r.as_dict(), "delivers_nowhere": t.delivers_nowhere} for r, t in zip(reports, tables, strict=True)],
                indent=2,
                default=str,
            )
        )
        return
    print_counts(reports)
    dead = [(r.table, code, n) for r in reports for code, n in r.dead_by_code.items()]
    if dead:
        print("\ndead by error code:")
        for table_name, code, n in dead:
            print(f"  {table_name:<18} {code:<22} {n}")
        print("\nto look at dead rows (changes nothing; drop --dry-run to replay them):")
        for command in status_replay_suggestions(args, reports):
            print(f"  {command}")
    lag_window = duration_words(reports[0].lag_window_s if reports else 3600)
    print(f"\nlag = created → delivered over the last {lag_window}, {LAG_LEGEND}")
    for r in reports:
        print_destination_health(r)
        print_paused(r)
    for r in reports:
        if r.blocked_keys:
            print(f"\n{blocked_keys_text(r)}")
            for command in blocked_key_suggestions(args, r):
                print(f"  {command}")
        if r.lock_holders:  # sessions holding the keys' locks back (core/oncall/lock_holders.py)
            print(f"\n{holders_text(r.table, r.lock_holders)}")
    for table in tables:
        if table.delivers_nowhere:
            print(f"\n{table.delivers_nowhere}")
            if _url_variable_unset(table.delivers_nowhere):  # this shell's environment, not the relays'
                print(
                    "  (read from this shell's environment: relays started elsewhere, by dev or a deployment, "
                    "read theirs)"
                )


def _url_variable_unset(delivers_nowhere: str) -> bool:
    """Whether the table goes nowhere because a variable naming its URL is unset (in this process)."""
    return any(f": {variable} is unset:" in delivers_nowhere for variable in URL_FROM_ENV.values())


def print_counts(reports: list[TableStatus]) -> None:
    """The table of figures: one line a table, rows per state then stuck, oldest and the lag percentiles."""
    width = max([18, *(len(r.table) + 1 for r in reports)])
    header = (
        f"{'table':<{width}}"
        + "".join(f"{s:>10}" for s in STATES)
        + f"{'stuck':>8}{'oldest':>9}{'lag p50':>9}{'p95':>8}{'p99':>8}"
    )
    print(header)
    for r in reports:
        print(
            f"{r.table:<{width}}" + "".join(f"{r.counts.get(s, 0):>10}" for s in STATES) + f"{r.stuck:>8}"
            f"{duration_words(r.oldest_pending_age_s):>9}{duration_words(r.lag_p50_s):>9}"
            f"{duration_words(r.lag_p95_s):>8}{duration_words(r.lag_p99_s):>8}"
        )


def print_destination_health(r: TableStatus) -> None:
    health = r.destination
    if health is None:
        return
    if health.failing:
        codes = ", ".join(f"{c}={n}" for c, n in health.error_codes.items())
        print(
            f"\n{r.table}: deliveries to {health.destination} have failed for "
            f"{duration_words(health.failing_for_s)} ({codes}); {while_failing(r)}"
        )
    if health.circuit_opened_at is not None:
        print(
            f"{r.table}: circuit open since {health.circuit_opened_at:%Y-%m-%d %H:%M:%S %Z}: one probe "
            "message at a time, no attempts spent; it closes on the first success"
        )
    if health.paused:
        print(f"{r.table}: paused {duration_words(health.paused_for_s)} more: the destination asked to slow down (429)")
    if health.relay_problem:
        since = f" since {health.relay_problem_since:%Y-%m-%d %H:%M:%S %Z}" if health.relay_problem_since else ""
        print(f"{r.table}: cannot be relayed{since}: {health.relay_problem}")


def print_paused(r: TableStatus) -> None:
    """A table or topics paused on purpose: what waits there is not lag (the lag check leaves it out)."""
    if not r.relay_enabled:
        print(f"\n{r.table}: relaying is switched off (relay_enabled = false): {r.waiting} messages wait, not lag")
    if r.paused_topics:
        oldest = f", the oldest for {duration_words(r.paused_oldest_s)}" if r.paused_oldest_s else ""
        print(
            f"\n{r.table}: paused topics: {paused_text(r.paused_topics)}; {r.paused_waiting} "
            f"message{'' if r.paused_waiting == 1 else 's'} wait there{oldest} (paused, not lag)"
        )


def _head(k: dict[str, Any]) -> str:
    error = redact_text(str(k.get("error") or ""))[:160]
    return f"key {k['key']}: id {k['id']} died with {k.get('error_code') or 'no code'}" + (
        f" ({error})" if error else ""
    )


def blocked_keys_text(r: Any) -> str:
    which = "; ".join(_head(k) for k in r.blocked_oldest)
    more = f"; and {r.blocked_keys - len(r.blocked_oldest)} more" if r.blocked_keys > len(r.blocked_oldest) else ""
    return (
        f"{r.table}: {r.blocked_keys} ordering key{'' if r.blocked_keys == 1 else 's'} blocked since "
        f"{r.blocked_since:%Y-%m-%d %H:%M:%S %Z} by a dead message; {r.blocked_messages} later "
        f"message{'' if r.blocked_messages == 1 else 's'} wait behind: {which}{more}. Replay the dead message "
        "(its key then goes on in order), or skip it (the rest of its key goes without it):"
    )


def blocked_key_suggestions(args: argparse.Namespace, r: Any) -> list[str]:
    prefix = shell_prefix(args)
    first = r.blocked_oldest[0]["id"]
    return [
        f"{prefix} replay --table {r.table} --id {first} --dry-run",
        f"{prefix} skip --table {r.table} --id {first} --dry-run",
    ]


def status_replay_suggestions(args: argparse.Namespace, reports: list[Any]) -> list[str]:
    """Replay commands that run as printed: per table with dead rows, its commonest code, and --all."""
    prefix = command_prefix(args)
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
