"""The command line's grammar: the argparse tree of every command, its options, help texts and value types.

Each command's parser names its function (``handler``, cli/handlers.py: its module is imported when it runs);
``main`` parses and calls it.
"""

import argparse
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from outbox_pipelines.cli.argument_types import (
    bind_host,
    death_time,
    duration,
    operator_text,
    port,
    row_id,
    server_port,
    whole_number,
)
from outbox_pipelines.cli.handlers import (
    cmd_broker_sim,
    cmd_clean,
    cmd_db_create_table,
    cmd_db_grant,
    cmd_db_hand_over,
    cmd_db_status,
    cmd_db_stop,
    cmd_db_upgrade,
    cmd_db_url,
    cmd_demo,
    cmd_dev,
    cmd_enqueue,
    cmd_init,
    cmd_metrics,
    cmd_oncall_page,
    cmd_order_api,
    cmd_relay,
    cmd_replay,
    cmd_requeue_stuck,
    cmd_skip,
    cmd_status,
)
from outbox_pipelines.cli.late_help import GRANT_HELP_LATER, GrantHelpFormatter, ShowVersion
from outbox_pipelines.cli.one_command import OneCommand, named_command

Handler = Callable[[argparse.Namespace], int]


# -- the tree: the top-level options, then each command's parser, in the order --help lists them ------------
def command(sub: Any, name: str, handler: Handler, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text, **kwargs)
    p.set_defaults(handler=handler)
    return p


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole tree; given the command line, only the command it names (cli/one_command.py)."""
    wanted = None if argv is None else named_command(argv)
    parser = argparse.ArgumentParser(
        prog="outbox-pipelines",
        description=(
            "Transactional outbox for PostgreSQL. Uses OUTBOX_DATABASE_URL; unset, the embedded PostgreSQL "
            "under the project's .outbox/ (the nearest directory up from here holding pyproject.toml, "
            "outbox.toml or .outbox) when 'dev' made one there or OUTBOX_EMBEDDED_DIR names one, else an error. "
            "Table settings come from OUTBOX_CONFIG, else the project's "
            "outbox.toml, else its OutboxComponent's defs.yaml (dg scaffold defs outbox_pipelines.OutboxComponent)."
        ),
        epilog="Exit codes: 0 done, 1 failed, 2 bad input or usage (nothing written).",
    )
    parser.add_argument(
        "--config",
        help="table settings file (TOML); default: $OUTBOX_CONFIG, else the project's "
        "outbox.toml or OutboxComponent defs.yaml",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the relay does")
    parser.add_argument("--version", action=ShowVersion, help="show program's version number and exit")
    sub = OneCommand(parser.add_subparsers(dest="command", metavar="COMMAND", required=True), wanted)
    add_db_commands(sub)
    add_message_commands(sub)
    add_maintenance_commands(sub)
    add_service_commands(sub)
    return parser if sub.built else build_parser()


def add_db_commands(sub: Any) -> None:
    dbp = sub.add_parser(
        "db",
        help="schema: upgrade, status, create-table, hand-over, grant, url, stop",
        description="Database schema and the embedded server.",
    )
    dbsub = dbp.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    p = dbsub.add_parser(
        "upgrade",
        help="apply the migrations and create the project's declared tables (safe to repeat, safe in parallel)",
        description="Apply the engine's migrations and those of the parts the project declares (parts = [...] in "
        "outbox.toml), then create every table it declares and record this project as their owner. Nothing "
        "else is created: no table of a part the project did not declare. A declared table another project "
        "owns is named with its owner (exit 1); 'db hand-over' moves a table between projects. Each migration "
        "waits for a lock at most OUTBOX_MIGRATION_LOCK_TIMEOUT_MS (500) at a time, then lets the application's "
        "writes through and tries again.",
    )
    p.add_argument("--dry-run", action="store_true", help="list the pending steps and their SQL; change nothing")
    p.add_argument(
        "--contract",
        action="store_true",
        help="the contract steps instead: drop what only the previous version used (an old claim index); run it once "
        "every relay and producer runs this version (refused while a relay started before the upgrade still runs)",
    )
    p.add_argument(
        "--sql", action="store_true", help="print the pending steps as one SQL script for your own migration tool"
    )
    p.set_defaults(handler=cmd_db_upgrade)
    p = dbsub.add_parser(
        "status",
        help="the schema against what this version needs: applied, pending, INVALID indexes (exit 1 while any), "
        "the server",
    )
    p.set_defaults(handler=cmd_db_status)
    p = dbsub.add_parser(
        "create-table",
        help="create outbox tables of the canonical shape",
        description="Create one or more outbox tables (each safe to repeat: an existing table's indexes and "
        "trigger are checked). Every name is checked before any table is created.",
    )
    p.add_argument("name", nargs="+", metavar="NAME", help="table name: lowercase letters, digits, _ (e.g. hrm_outbox)")
    p.add_argument("--dedup", action="store_true", help="add the index that makes (topic, payload_sha) dedup fast")
    p.set_defaults(handler=cmd_db_create_table)
    p = dbsub.add_parser(
        "hand-over",
        help="make this project the owner of a table another project owns (a deliberate move)",
        description="Each outbox table belongs to the project that declared it first ('db upgrade', 'db "
        "create-table'); the relays of any other project leave it alone. Run this in the project taking the "
        "table over; --from names the project that owns it now, so nothing moves by mistake. Stop the old "
        "owner's relays of the table first. This project's name: OUTBOX_PROJECT, else pyproject.toml's "
        "[project] name, else the project directory's name.",
    )
    p.add_argument("table", metavar="TABLE", help="the outbox table to take over")
    p.add_argument("--from", dest="from_project", required=True, metavar="PROJECT", help="the project that owns it")
    p.set_defaults(handler=cmd_db_hand_over)
    p = dbsub.add_parser(
        "grant",
        help="create the least-privilege database roles and grant their rights (re-run after create-table)",
        description=GRANT_HELP_LATER,
        formatter_class=GrantHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="print the SQL it would run; change nothing")
    p.set_defaults(handler=cmd_db_grant)
    p = dbsub.add_parser(
        "url", help="print the database URL in use, its password masked (starts the embedded server if needed)"
    )
    p.add_argument(
        "--show-password",
        action="store_true",
        help="print the password too (for scripts; keep it off screens and logs)",
    )
    p.set_defaults(handler=cmd_db_url)
    p = dbsub.add_parser("stop", help="stop the project's embedded PostgreSQL (under its .outbox/)")
    p.set_defaults(handler=cmd_db_stop)


def add_message_commands(sub: Any) -> None:
    """enqueue, status, relay and replay."""
    add = partial(command, sub)

    p = add("enqueue", cmd_enqueue, "enqueue one message (in its own transaction)")
    p.add_argument("--table", required=True, help="outbox table, one the project declares (e.g. billing_outbox)")
    p.add_argument("--topic", required=True, help="message topic / event type")
    p.add_argument("--payload", required=True, help="JSON object, @file.json, or - for stdin")
    p.add_argument("--event-id", help="idempotency key (default: a new UUID)")
    p.add_argument("--tenant", help="tenant id")
    p.add_argument(
        "--ordering-key",
        metavar="KEY",
        help="deliver after every earlier message of this key, one at a time (the aggregate: order-42)",
    )
    p.add_argument("--trace-id", help="trace id, stored in the headers")
    p.add_argument("--header", action="append", metavar="KEY=VALUE", help="extra header (repeatable)")
    p.add_argument("--allow-unknown-topic", action="store_true", help="enqueue even if no handler knows the topic")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = add("status", cmd_status, "per table: rows per state, stuck, oldest pending age, lag p50/p95/p99, dead by code")
    p.add_argument("--table", action="append", help="only this table (repeatable); default: every configured table")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add(
        "relay",
        cmd_relay,
        "run a relay worker: claim, dispatch, settle",
        epilog=(
            "Behind a transaction pooler (PgBouncer) set OUTBOX_DIRECT_DATABASE_URL to a direct connection: the "
            "relay's session (LISTEN wake-ups, the single-active lock) needs one. Without it a competing table's "
            "relay polls, and a single-active table's relay refuses to start."
        ),
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--table", help="outbox table to relay")
    which.add_argument(
        "--group",
        help="relay every table of this relay group in one process, each on a worker of "
        "its own ('default' unless outbox.toml gives a table another group)",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--once", action="store_true", help="drain what is ready now, then exit")
    budget.add_argument(
        "--max-seconds", type=duration, metavar="S", help="stop claiming after S seconds (finishes the batch in flight)"
    )
    p.add_argument("--max-entries", type=whole_number(), metavar="N", help="stop after claiming N messages")
    p.add_argument(
        "--batch-size", type=whole_number(), help="messages per claim (default: table setting / OUTBOX_BATCH_SIZE)"
    )
    p.add_argument("--worker-id", type=operator_text, help="lease holder name (default: host:pid:random)")
    p.add_argument("--force", action="store_true", help="run even if the relay is disabled for the table")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--metrics-port", type=port, metavar="PORT", help="serve Prometheus /metrics on PORT")
    p.add_argument("--metrics-host", type=bind_host, help="its address (default: $OUTBOX_METRICS_HOST, else 127.0.0.1)")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")

    p = add("replay", cmd_replay, "move dead messages back to pending (attempts reset), by filter")
    p.add_argument("--table", required=True, help="outbox table, one the project declares (e.g. billing_outbox)")
    p.add_argument("--id", type=row_id, action="append", metavar="ID", help="row id (repeatable)")
    p.add_argument("--topic", help="only rows of this topic")
    p.add_argument("--tenant", help="only rows of this tenant id")
    p.add_argument(
        "--error-code",
        metavar="CODE",
        help="only rows that died with this code, any case: e.g. BROKER_5XX, NETWORK_TIMEOUT, UNAUTHORIZED "
        "(UNKNOWN = no code; 'outbox-pipelines status' lists the codes of dead rows)",
    )
    p.add_argument(
        "--since",
        type=death_time("since"),
        metavar="TIME",
        help="died at or after TIME: ISO 8601 like 2026-11-21T10:00:00Z (UTC if no offset), a date "
        "like 2026-11-21, or a time ago like 30m, 2h, 7d",
    )
    p.add_argument(
        "--until", type=death_time("until"), metavar="TIME", help="died before TIME (same formats as --since)"
    )
    p.add_argument("--all", action="store_true", help="every dead row of the table (needed when no filter is given)")
    p.add_argument("--dry-run", action="store_true", help="list what would be replayed; change nothing")
    p.add_argument("--force", action="store_true", help="also replay rows that died of BAD_REQUEST")
    p.add_argument("--reason", type=operator_text, help="why, kept in each audit row (one printable line)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (rows, counts, filter)")

    p = add(
        "skip",
        cmd_skip,
        "pass over a dead message that blocks its ordering key: the rest of the key goes on",
        epilog="The message stays dead (replay it later and it goes out unordered); the skip is audited "
        '(outbox_skip). Under ordering = "park" (the default) a dead message blocks the later '
        "messages of its key until it is replayed or skipped.",
    )
    p.add_argument("--table", required=True, help="outbox table")
    p.add_argument("--id", type=row_id, action="append", metavar="ID", help="the dead message's row id (repeatable)")
    p.add_argument("--key", metavar="KEY", help="every parked dead message of this ordering key")
    p.add_argument("--reason", type=operator_text, help="why, kept in the audit row (one printable line)")
    p.add_argument("--dry-run", action="store_true", help="list what would be skipped; change nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def add_maintenance_commands(sub: Any) -> None:
    add = partial(command, sub)

    p = add("requeue-stuck", cmd_requeue_stuck, "return sending rows with an expired lease (or stuck) to pending")
    p.add_argument("--table", action="append", help="only this table (repeatable)")
    p.add_argument(
        "--threshold",
        type=duration,
        help="stuck after this long in sending (default: each table's stuck_threshold, OUTBOX_STUCK_THRESHOLD_MIN); "
        "one under twice a running relay's lease renewal is refused: it would take that relay's rows",
    )
    p.add_argument("--force", action="store_true", help="accept a --threshold that short (no relay of it runs)")

    p = add("clean", cmd_clean, "delete sent, dead and audit rows past their retention, and expired ledger rows")
    p.add_argument("--table", action="append", help="only this table (repeatable)")
    p.add_argument(
        "--retention", type=duration, help="keep sent rows this long (default OUTBOX_CLEANER_RETENTION, 168h)"
    )
    p.add_argument(
        "--audit-retention", type=duration, help="keep audit rows this long (default OUTBOX_AUDIT_RETENTION, 30d)"
    )
    p.add_argument("--tenant", help="only this tenant's sent rows (expired ledger rows are cleaned regardless)")
    p.add_argument(
        "--force",
        action="store_true",
        help="run even if the cleaner is disabled, and accept a retention shorter than the table's dedup "
        "horizon (at least 1h; sent rows are what dedups a repeated event_id or payload)",
    )


def add_service_commands(sub: Any) -> None:
    """The Order API, the broker simulator, the Dagster dev stack and the demo."""
    add = partial(command, sub)

    p = add(
        "init",
        cmd_init,
        "write the project's first outbox.toml (one table, named after the project), print the example that "
        "lists every key (--print-example), or copy the example project (--example-project DIR)",
    )
    p.add_argument("--table", help="the table to declare (default: <project>_outbox)")
    p.add_argument(
        "--print-example", action="store_true", help="print outbox.example.toml (every key, explained); write nothing"
    )
    p.add_argument(
        "--example-project",
        metavar="DIR",
        help="copy the example Dagster project (examples/billing_service: a package, two outbox tables in an "
        "OutboxComponent, a handler) into DIR, a new directory",
    )

    p = add("order-api", cmd_order_api, "serve the Order API (POST /do/order) with its idempotency ledger")
    p.add_argument("--host", type=bind_host, default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=server_port, default=8080)
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="serve without OUTBOX_API_TOKEN on a non-loopback --host (anyone who reaches it can place orders)",
    )
    p.add_argument(
        "--upgrade",
        action="store_true",
        help="run db upgrade before serving (without it, a database that lacks a migration is refused, saying which)",
    )

    from outbox_pipelines.orders.broker_faults import CONTROL_HELP, add_fault_options  # the demo broker's, here only

    p = add(
        "broker-sim",
        cmd_broker_sim,
        "a local broker that executes each idempotency key once, with fault injection",
        epilog=CONTROL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_fault_options(p)

    p = add(
        "dev",
        cmd_dev,
        "start the Dagster UI and daemon on the outbox (embedded default), with schedules and sensors on; "
        "Dagster's ticks that found nothing to do are left out of the terminal (outbox-pipelines -v dev "
        "shows them)",
    )
    p.add_argument(
        "--host",
        type=bind_host,
        default="127.0.0.1",
        help="address to serve the UI on (default 127.0.0.1); one other than loopback needs --allow-remote",
    )
    p.add_argument("--port", type=server_port, default=3000)
    p.add_argument(
        "--oncall-port",
        type=server_port,
        default=None,
        help="port of the on-call page dev serves next to the UI (default: --port + 1, or a free one if taken)",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="serve the UI on a non-loopback --host: it has no login, so anyone who reaches it can launch "
        "runs (put an authenticating proxy in front; docs/deploy.md)",
    )

    p = add(
        "oncall-page",
        cmd_oncall_page,
        "serve the on-call page: every table's health and counts, its dead and blocked messages, a search by event "
        "id, key or tenant, and replay / skip launched as Dagster jobs through OUTBOX_UI_URL (dry run first)",
    )
    p.add_argument("--host", type=bind_host, default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=server_port, default=3100, help="port to listen on (default 3100; 0: a free one)")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="serve on a non-loopback --host: it has no login, so anyone who reaches it can replay and skip",
    )
    p.add_argument(
        "--dagster-url",
        metavar="URL",
        help="where the page reaches the Dagster webserver to launch runs, when not at OUTBOX_UI_URL (the address "
        "its links use), e.g. http://webserver:3000 in a container",
    )

    p = add("metrics", cmd_metrics, "serve the tables' state for Prometheus (relays run by Dagster serve none)")
    p.add_argument("--host", type=bind_host, help="address (default: $OUTBOX_METRICS_HOST, else 127.0.0.1)")
    p.add_argument("--port", type=server_port, default=9464, help="port to listen on (default 9464)")
    p.add_argument("--table", action="append", help="this table only (repeatable; default: every declared table)")

    p = add("demo", cmd_demo, "run the outbox end to end on the embedded default and print what happened")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--reset",
        action="store_true",
        help="start afresh: stop the demo's PostgreSQL and remove its data first (the directory it uses outside "
        "any project, $XDG_DATA_HOME/outbox-pipelines/demo; a project's .outbox/ is left to you)",
    )
