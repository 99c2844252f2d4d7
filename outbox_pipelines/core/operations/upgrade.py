"""A project's schema brought up to date: ``db upgrade``, ``dev`` and the Order API's start call this."""

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from outbox_pipelines.core.inbox.schema import create_inbox, list_inboxes
from outbox_pipelines.core.names import is_valid_table_name
from outbox_pipelines.core.prepare import payload_limit as configured_payload_limit
from outbox_pipelines.core.settings import Settings
from outbox_pipelines.core.storage import autovacuum, migrate, payload_limit, schema
from outbox_pipelines.core.storage.autovacuum import AutovacuumReport
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.migration_files import Migration
from outbox_pipelines.core.storage.migration_safety import LockWaits
from outbox_pipelines.core.storage.payload_limit import PayloadLimitReport
from outbox_pipelines.core.storage.table_owners import Owner, claim, owners


@dataclass
class ProjectUpgrade:
    applied: list[str] = field(default_factory=list)  # migrations applied now
    created: list[str] = field(default_factory=list)  # declared tables created now
    tables: list[str] = field(default_factory=list)  # every declared table, created now or before
    owned_elsewhere: dict[str, Owner] = field(default_factory=dict)  # declared here, owned by another project
    autovacuum: AutovacuumReport | None = None  # the tables' autovacuum settings (storage/autovacuum.py)
    payload_limit: PayloadLimitReport | None = None  # the tables' payload limit (storage/payload_limit.py)
    inboxes_created: list[str] = field(default_factory=list)  # declared inbox tables created now
    inboxes: list[str] = field(default_factory=list)  # every declared inbox table, created now or before


def declared_tables(settings: Settings) -> dict[str, bool]:
    """Every table the project declares, with whether it gets the dedup index: the usable ones, and those whose
    section cannot be used but whose name can (the application may enqueue before the section is fixed)."""
    declared = {name: table.dedup for name, table in settings.tables.items()}
    declared.update({name: False for name in settings.broken if is_valid_table_name(name)})
    return declared


def upgrade_project(url: str, settings: Settings, *, said: Callable[[str], None] | None = None) -> ProjectUpgrade:
    """What ``db upgrade`` does for a project: the engine's migrations and those of the parts it declares, then
    each table it declares that does not exist yet (one whose section cannot be used included: the application
    may enqueue before the section is fixed), recorded as the project's unless another project owns it
    (``owned_elsewhere``). Nothing else: no table of a part it did not declare. An existing table is left as it
    is, so a login that does not own the tables (the Order API's) upgrades an up-to-date database as a no-op."""
    autovacuum.parse(settings.env.autovacuum)  # a bad OUTBOX_AUTOVACUUM refuses before anything changes
    max_payload_bytes = configured_payload_limit()  # and a bad OUTBOX_MAX_PAYLOAD_BYTES
    waits = LockWaits.from_env(said=said)  # ``said`` hears each wait for a lock the application holds
    sized = payload_limit.migration_settings(max_payload_bytes, settings.project)  # what 0020 gives the tables
    report = ProjectUpgrade(applied=migrate.upgrade(url, parts=settings.parts, waits=waits, settings=sized))
    declared = declared_tables(settings)
    existing = set(schema.list_tables(url)) if declared else set()
    for name, dedup in sorted(declared.items()):
        if name not in existing and schema.create_table(url, name, dedup_index=dedup):
            report.created.append(name)
        report.tables.append(name)
    if report.tables:
        report.owned_elsewhere = _record_owners(url, report.tables, settings.project)
    ours = [name for name in report.tables if name not in report.owned_elsewhere]
    report.autovacuum = autovacuum.apply(url, [*ours, autovacuum.AUDIT], settings.env.autovacuum)
    report.payload_limit = payload_limit.apply(url, ours, max_payload_bytes, waits)
    existing_inboxes = set(list_inboxes(url)) if settings.inboxes else set()
    for name in sorted(settings.inboxes):
        if name not in existing_inboxes and create_inbox(url, name):
            report.inboxes_created.append(name)
        report.inboxes.append(name)
    return report


def size_payload_limit(url: str, tables: list[str]) -> PayloadLimitReport:
    """Give ``tables`` (this project's) the payload limit OUTBOX_MAX_PAYLOAD_BYTES says (``db create-table``)."""
    return payload_limit.apply(url, tables, configured_payload_limit())


def _record_owners(url: str, tables: list[str], project: str) -> dict[str, Owner]:
    """Record ``project`` as the owner of those of ``tables`` nobody owns; those another project owns. A login
    without the right to read or write the owners (an application's) records nothing: the schema owner's
    ``db upgrade`` does."""
    with connect(url) as conn:
        try:
            recorded = owners(conn, tables)
            unowned = [name for name in tables if name not in recorded]
            return claim(conn, unowned, project) | {n: o for n, o in recorded.items() if o.project != project}
        except psycopg.errors.InsufficientPrivilege:
            return {}


@dataclass
class UpgradePlan:
    """What ``upgrade_project`` would do now, changing nothing: ``db upgrade --dry-run`` and ``--sql``."""

    migrations: list[Migration]
    new_tables: dict[str, bool]  # declared tables not in the database yet -> with the dedup index
    steps: dict[str, list[str]] = field(default_factory=dict)  # a no-transaction migration's statements, here
    storage: list[str] = field(default_factory=list)  # the tables' autovacuum settings (storage/autovacuum.py)
    limits: list[str] = field(default_factory=list)  # the tables' payload limit (storage/payload_limit.py)
    new_inboxes: list[str] = field(default_factory=list)  # declared inbox tables not in the database yet

    def as_sql(self, project: str, lock_timeout_s: float) -> str:
        """One script for a team's own migration tool (Alembic, Flyway, Django): the migrations as ``upgrade``
        runs and records them, then the new tables and their owner. Table names are validated names."""
        lines = [migrate.as_sql_script(self.migrations, lock_timeout_s, self.steps)] if self.migrations else []
        for name, dedup in self.new_tables.items():
            lines.append(f"SELECT outbox_create_table('{name}', with_dedup_index => {str(dedup).lower()});")
            lines.append(
                "INSERT INTO outbox_table_owners (outbox_table, project) "
                f"VALUES ('{name}', {_literal(project)}) ON CONFLICT (outbox_table) DO NOTHING;"
            )
        lines += self.storage + self.limits
        lines += [f"SELECT outbox_create_inbox('{name}');" for name in self.new_inboxes]
        return "\n".join(lines) + "\n" if lines else "-- nothing to do: the database is up to date\n"


def _literal(text: str) -> str:
    """A SQL string literal of ``text`` (a project name, printed for people to run, never executed here)."""
    return "'" + text.replace("'", "''") + "'"


def plan_project(url: str, settings: Settings, *, contract: bool = False) -> UpgradePlan:
    """What ``upgrade_project`` (or, ``contract``, ``contract_project``) would do now; nothing is changed."""
    if contract:
        steps = migrate.pending_contract_steps(url)
        return UpgradePlan(steps, {}, migrate.concrete_steps(url, steps))
    declared = declared_tables(settings)
    pending = migrate.pending_migrations(url, parts=settings.parts)
    existing = set(schema.list_tables(url)) if declared and not any(m.version == "0001" for m in pending) else set()
    new_tables = {name: dedup for name, dedup in sorted(declared.items()) if name not in existing}
    storage = autovacuum.plan_sql(url, [*sorted(declared), autovacuum.AUDIT], settings.env.autovacuum)
    max_payload_bytes = configured_payload_limit()
    limits = payload_limit.plan_sql(url, sorted(declared), max_payload_bytes)
    sized = payload_limit.migration_settings(max_payload_bytes, settings.project)
    plan = UpgradePlan(pending, new_tables, migrate.concrete_steps(url, pending, sized), storage, limits)
    fresh = any(m.version == "0001" for m in pending)
    existing_inboxes = set(list_inboxes(url)) if settings.inboxes and not fresh else set()
    plan.new_inboxes = [name for name in sorted(settings.inboxes) if name not in existing_inboxes]
    return plan


def contract_project(url: str, settings: Settings, *, said: Callable[[str], None] | None = None) -> list[str]:
    """``db upgrade --contract``: the contract steps (what the previous version still used), once the expand is
    applied and no relay that started before it runs; the names applied now."""
    return migrate.upgrade(url, parts=settings.parts, waits=LockWaits.from_env(said=said), contract=True)
