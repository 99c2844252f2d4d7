"""``outbox-pipelines db ...``: the schema (upgrade, create-table), the least-privilege roles (grant), and the
database in use (url, stop the embedded server). The work is the storage room's; these say what it did."""

import argparse
import os

import psycopg

from outbox_pipelines.cli.inputs import database_url, say_left_out, settings_of
from outbox_pipelines.cli.output import EXIT_FAILED, EXIT_OK, UsageError, say
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.operations import upgrade
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.storage import db, migrate, payload_limit, roles, schema, schema_drift, table_owners
from outbox_pipelines.core.storage.migration_safety import LockWaits

NOT_MIGRATED = "the database is not migrated yet: run 'outbox-pipelines db upgrade' first"


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    settings = settings_of(args)  # before connecting: a declaration that cannot be read changes nothing
    url = database_url(schema_checked=False)
    if args.dry_run or args.sql:
        plan = upgrade.plan_project(url, settings, contract=args.contract)
        return _show_plan(plan, settings.project, as_sql=args.sql)
    if args.contract:
        applied = upgrade.contract_project(url, settings, said=say)
        print("\n".join(f"applied {name}" for name in applied) or "nothing to contract: already done")
        return EXIT_OK
    report = upgrade.upgrade_project(url, settings, said=say)
    for name in report.applied:
        print(f"applied {name}")
    for name in report.created:
        print(f"created outbox table {name}")
    for name in report.inboxes_created:
        print(f"created inbox table {name}")
    if not report.applied and not report.created and not report.inboxes_created:
        print("database is up to date")
    for owner in report.owned_elsewhere.values():
        say(f"error: {owner.refusal(settings.project)}")
    _say_payload_limit(report.payload_limit)
    if report.autovacuum is not None and report.autovacuum.applied:  # docs/how-to/retention.md
        print(f"autovacuum settings (OUTBOX_AUTOVACUUM) set on: {', '.join(report.autovacuum.applied)}")
    for table, why in (report.autovacuum.skipped if report.autovacuum is not None else {}).items():
        say(f"warning: autovacuum settings of {table} not set: {why}")
    ours = [name for name in report.tables if name not in report.owned_elsewhere]  # those refused are told above
    if ours:
        print(f"outbox tables of this project ({settings.project}): {', '.join(ours)}")
    elif not report.tables:
        print(
            "this project declares no outbox table yet: add a [tables.NAME] section to outbox.toml "
            "(or parts = [...]) and run db upgrade again"
        )
    if report.inboxes:
        print(f"inbox tables of this project: {', '.join(report.inboxes)}")
    if report.owned_elsewhere:
        return EXIT_FAILED
    # A section with a mistake (a credential variable unset is none: the migration's environment need not hold
    # it): its table is created all the same, and the command says what to fix, as every command does.
    return say_left_out(settings.broken_for_operations)


def _say_payload_limit(report: payload_limit.PayloadLimitReport | None) -> None:
    """The tables given OUTBOX_MAX_PAYLOAD_BYTES as their database limit now, and those left (and why)."""
    if report is None:
        return
    if report.applied:
        print(f"payload limit of {report.max_bytes} bytes (OUTBOX_MAX_PAYLOAD_BYTES) on: {', '.join(report.applied)}")
    for table, why in report.skipped.items():
        say(f"warning: payload limit of {table} not set: {why}")


def _show_plan(plan: upgrade.UpgradePlan, project: str, *, as_sql: bool) -> int:
    """``db upgrade --sql``: the script; ``--dry-run``: each pending step with its SQL. Nothing is changed."""
    if as_sql:
        print(plan.as_sql(project, LockWaits.from_env().lock_timeout_s), end="")
        return EXIT_OK
    if not plan.migrations and not plan.new_tables and not plan.storage and not plan.limits and not plan.new_inboxes:
        print("database is up to date: nothing would be done")
    for migration in plan.migrations:
        if migration.version in plan.steps:
            statements = "\n".join(plan.steps[migration.version]) or "-- (no step: nothing to do on this database)"
            print(f"-- would apply {migration.name} (outside a transaction: each statement on its own)\n{statements}\n")
        else:
            print(f"-- would apply {migration.name} (in one transaction)\n{migration.sql.strip()}\n")
    for name in plan.new_tables:
        print(f"would create outbox table {name} (owned by {project})")
    for name in plan.new_inboxes:
        print(f"would create inbox table {name}")
    if plan.storage:  # docs/how-to/retention.md
        print("-- would set the tables' autovacuum settings (OUTBOX_AUTOVACUUM)\n" + "\n".join(plan.storage))
    if plan.limits:
        print("-- would set the tables' payload limit (OUTBOX_MAX_PAYLOAD_BYTES)\n" + "\n".join(plan.limits))
    if plan.migrations or plan.new_tables or plan.storage or plan.limits:
        print("dry run: nothing was changed ('outbox-pipelines db upgrade' does it; --sql prints a script)")
    return EXIT_OK


def cmd_db_status(args: argparse.Namespace) -> int:
    """The schema against what this version needs: applied, pending, drift (missing or INVALID indexes, changed
    functions, missing grants: core/storage/schema_drift.py; exit 1 while there is any of these), the server."""
    settings = settings_of(args)
    url = database_url(schema_checked=False)
    server, applied = migrate.applied(url)
    pending = migrate.pending(url, parts=settings.parts)
    engine = [name for name in applied if "/" not in name]
    print(f"server: PostgreSQL {server}")
    print(f"schema: {engine[-1] if engine else 'none'} applied; this version needs {migrate.needed_version()}")
    if parts := [name for name in applied if "/" in name and not name.startswith("contract/")]:
        print(f"parts: {', '.join(parts)}")
    with db.connect(url) as conn:
        drift = schema_drift.find_drift(conn, sorted(upgrade.declared_tables(settings)), settings.parts)
    for found in drift:
        print(f"drift: {found.sentence}")
    if pending:
        print(f"pending: {', '.join(pending)} (outbox-pipelines db upgrade --dry-run shows their SQL)")
    else:
        print("pending: none")
    if not pending and (contract := [m.name for m in migrate.pending_contract_steps(url)]):
        print(
            f"contract: {', '.join(contract)} not applied (when every relay runs this version: db upgrade --contract)"
        )
    return EXIT_FAILED if pending or drift else EXIT_OK


def cmd_db_create_table(args: argparse.Namespace) -> int:
    settings = settings_of(args)  # its parts' shared tables are reserved names too
    names = list(dict.fromkeys(args.name))
    for name in names:  # every name checked before any table is created
        validate_table_name(name)
    url = database_url(schema_checked=False)
    if migrate.pending(url):
        raise UsageError(NOT_MIGRATED)
    refused = 0
    for name in names:
        created = schema.create_table(url, name, dedup_index=args.dedup)
        with db.connect(url) as conn:
            owned_elsewhere = table_owners.claim(conn, [name], settings.project)
        if owned_elsewhere:
            say(f"error: {owned_elsewhere[name].refusal(settings.project)}")
            refused += 1
            continue
        print(
            f"created outbox table {name}"
            if created
            else f"outbox table {name} already exists (checked its indexes and trigger)"
        )
        _say_payload_limit(upgrade.size_payload_limit(url, [name]))
        if name in settings.broken:  # declared, but its section cannot be used: say why, not "add a section"
            say(f"warning: {name} cannot be relayed until its section is fixed: {settings.broken[name]}")
        elif name not in settings.tables:
            print(f"add a [tables.{name}] section to your outbox.toml (OUTBOX_CONFIG) to relay it")
    return EXIT_FAILED if refused else EXIT_OK


def cmd_db_hand_over(args: argparse.Namespace) -> int:
    """Make this project the owner of a table another project owns: the deliberate hand-over."""
    validate_table_name(args.table)
    settings = settings_of(args)
    url = database_url(schema_checked=False)
    if migrate.pending(url):
        raise UsageError(NOT_MIGRATED)
    with db.connect(url) as conn:
        owner = table_owners.owners(conn, [args.table]).get(args.table)
        if owner is None:
            table_owners.claim(conn, [args.table], settings.project)
            print(f"{args.table} had no owner; it is now {settings.project!r}'s")
            return EXIT_OK
        if owner.project == settings.project:
            print(f"{args.table} is already {settings.project!r}'s: nothing to hand over")
            return EXIT_OK
        if owner.project != args.from_project:
            raise UsageError(
                f"{args.table} belongs to {owner.project!r}, not {args.from_project!r}: nothing changed. "
                f"To take it from its owner: outbox-pipelines db hand-over {args.table} --from {owner.project}"
            )
        table_owners.hand_over(conn, args.table, owner.project, settings.project)
    print(
        f"{args.table} handed over from {owner.project!r} to {settings.project!r}; "
        f"{owner.project!r}'s relays leave it alone from their next start (stop them now if they run)"
    )
    if args.table not in settings.tables:
        say(f"warning: this project does not declare {args.table}: add a [tables.{args.table}] section to relay it")
    return EXIT_OK


def cmd_db_grant(args: argparse.Namespace) -> int:
    settings_of(args)  # the parts the project declares: their tables' rights and roles are granted too
    url = database_url(schema_checked=False)
    if migrate.pending(url):
        raise UsageError(NOT_MIGRATED)
    try:
        plan, statements = roles.grant_roles(url, dry_run=args.dry_run)
    except roles.GrantRefused as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except psycopg.errors.InsufficientPrivilege as exc:  # CREATE ROLE without CREATEROLE
        say(
            f"error: the database refused: {redact_text(str(exc).strip().splitlines()[0])}. Run 'db grant' as the "
            "owner of the outbox tables with CREATEROLE (or as a superuser), like 'db upgrade'."
        )
        return EXIT_FAILED
    if args.dry_run:
        print("\n".join(statements))
        print("-- dry run: nothing changed")
        return EXIT_OK
    if plan.missing_roles:
        print(f"created roles: {', '.join(plan.missing_roles)}")
    print(
        f"granted on schema {plan.schema} and its {len(plan.outbox_tables)} outbox tables "
        f"({', '.join(plan.outbox_tables) or 'none'})"
        + (
            f" and {len(plan.inbox_tables)} inbox tables ({', '.join(plan.inbox_tables)}):"
            if plan.inbox_tables
            else ":"
        )
    )
    for spec in roles.all_roles():
        print(f"  {spec.name}: {spec.job}")
        for line in roles.rights(spec):
            print(f"      {line}")
    if plan.absent_tables:
        print(f"not in this database, skipped: {', '.join(plan.absent_tables)}")
    print(
        "put each process's login role in its group (GRANT outbox_relay TO relay_login), and run "
        "'outbox-pipelines db grant' again after 'db create-table' so the roles reach the new table"
    )
    return EXIT_OK


def cmd_db_url(args: argparse.Namespace) -> int:
    url = database_url(schema_checked=False)
    print(url if args.show_password else db.mask_url(url))
    return EXIT_OK


def cmd_db_stop(args: argparse.Namespace) -> int:
    if os.environ.get(db.DATABASE_URL_ENV):
        raise UsageError("OUTBOX_DATABASE_URL is set: this command only stops the embedded server")
    root = db.embedded_dir()
    stopped = db.stop_embedded(root)
    print(
        f"stopped the embedded PostgreSQL under {root}"
        if stopped
        else f"no embedded PostgreSQL was running under {root}"
    )
    return EXIT_OK
