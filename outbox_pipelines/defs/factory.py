"""The outbox's Dagster definitions for a project: one function, ``outbox_definitions``, used by this
repository's code location, by ``OutboxComponent`` and by a ``Definitions`` written by hand
(``outbox_definitions(tables={"billing_outbox": {...}})``). The tables are sections as ``outbox.toml`` writes
them, read by the same rules; without ``tables``, the project's ``outbox.toml``.
"""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from outbox_pipelines.core.names import is_valid_table_name
from outbox_pipelines.core.settings import Settings, load_settings_or_problem
from outbox_pipelines.core.settings.declarations import Declaration
from outbox_pipelines.defs.alerts import run_failure_alert
from outbox_pipelines.defs.backfill import backfill_jobs
from outbox_pipelines.defs.checks import CHECKS_JOB_NAME, assets_and_checks, checks_job
from outbox_pipelines.defs.database_checks import database_checks
from outbox_pipelines.defs.maintenance import maintenance_jobs, prune_run_history_job
from outbox_pipelines.defs.oncall_sensor import oncall_sensor
from outbox_pipelines.defs.relay_group import relay_group_job_name, relay_jobs
from outbox_pipelines.defs.replay import replay_jobs
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines.defs.schedules import backlog_sensor, maintenance_schedules, relay_schedules
from outbox_pipelines.defs.schema_checks import schema_checks
from outbox_pipelines.defs.skip import skip_jobs

# Set by `dg check defs` and `dagster definitions validate` while they load the code location (Dagster's own).
VALIDATION_ENV = "DAGSTER_IS_DEFS_VALIDATION_CLI"


def declaration_of(
    tables: Mapping[str, Mapping[str, Any]],
    *,
    parts: Sequence[str] = (),
    shipped_tables: bool = False,
    source: Path | None = None,
) -> Declaration:
    """A project's tables and parts as a declaration: ConfigError on a bad shape."""
    return Declaration.from_mapping({"tables": tables, "parts": list(parts), "shipped_tables": shipped_tables}, source)


def load_project_settings(declaration: Declaration | None) -> Settings:
    """The settings the definitions are built from. Under `dg check defs` / `dagster definitions validate`,
    a table whose section cannot be used (an invalid key, a handlers module that does not import) fails
    validation with its message; loaded for running, the code location goes on without it (its relay check
    and one alert say why, and no sensor launches a run for it). A declaration that cannot be read at all
    (not TOML, an unknown top-level key) fails validation too; loaded for running, the code location still
    loads, with no table, and the on-call sensor alerts with what to fix."""
    settings = load_settings_or_problem(declaration=declaration)
    if os.environ.get(VALIDATION_ENV) == "1":
        settings.check()
    return settings


def outbox_definitions(
    tables: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    parts: Sequence[str] = (),
    shipped_tables: bool = False,
    source: Path | None = None,
    resources: Mapping[str, Any] | None = None,
    declaration: Declaration | None = None,
) -> dg.Definitions:
    """Assets, checks, relay jobs and their schedules and sensors, maintenance, replay, skip, backfill and
    alerts for the project's outbox tables.

    ``tables``: ``{name: section}`` as outbox.toml's ``[tables.NAME]``, with the tables of ``parts`` (opt-in
    parts, e.g. ``["orders"]``; ``shipped_tables=True``: every installed one); None reads OUTBOX_CONFIG / the
    project's outbox.toml. ``source`` names where they are declared in messages; ``declaration`` stands for
    all three when it was read already (several components'). ``resources``: the deployment's (default
    ``outbox_resources``: the database from OUTBOX_DATABASE_URL or the embedded server)."""
    if declaration is None and tables is not None:
        declaration = declaration_of(tables, parts=parts, shipped_tables=shipped_tables, source=source)
    return build_from_settings(
        load_project_settings(declaration),
        resources if resources is not None else outbox_resources(declaration=declaration),
    )


def build_from_settings(settings: Settings, resources: Mapping[str, Any]) -> dg.Definitions:
    """The definitions of ``settings``' tables; every table has its asset, those whose section cannot be used
    included (an asset whose relay check says why), and only the usable ones a relay."""
    tables = sorted({*settings.tables, *(name for name in settings.broken if is_valid_table_name(name))})
    groups = {
        group: relayed
        for group, names in settings.groups().items()
        if (relayed := [t for t in names if settings.tables[t].relay_enabled])
    }
    launchable = sorted(settings.tables)  # what a launch (relay, clean, replay, ...) can name: a Dagster Enum of them
    jobs = relay_jobs(groups, launchable) + maintenance_jobs(launchable) + replay_jobs(launchable)
    jobs += skip_jobs(launchable) + backfill_jobs(launchable)
    jobs.append(prune_run_history_job([job.name for job in jobs] + [CHECKS_JOB_NAME]))
    by_name = {job.name: job for job in jobs}
    assets, checks = assets_and_checks(tables)
    if tables:  # the database schema's version and drift, once the project declares an outbox table
        schema_assets, schema_asset_checks = schema_checks()
        assets, checks = assets + schema_assets, checks + schema_asset_checks
    return dg.Definitions(
        assets=assets,
        asset_checks=checks + database_checks(tables),
        jobs=[*jobs, checks_job([asset.key for asset in assets])],
        schedules=relay_schedules(groups, by_name) + maintenance_schedules(by_name),
        sensors=[
            backlog_sensor(group, names, by_name[relay_group_job_name(group)])
            for group, names in sorted(groups.items())
        ]
        + [oncall_sensor, run_failure_alert],
        resources=dict(resources),
    )
