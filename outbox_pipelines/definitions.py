"""The Dagster code location of outbox_pipelines: one explicit Definitions.

Tables come from the same settings as the CLI (built-in defaults, OUTBOX_CONFIG);
the database from OUTBOX_DATABASE_URL or the embedded default.
"""

import os
from collections.abc import Mapping
from typing import Any

import dagster as dg

# Importing outbox_pipelines.defs first silences Dagster's beta/supersession notices (defs/__init__.py).
from outbox_pipelines.core.names import is_valid_table_name
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.defs.alerts import oncall_sensor, run_failure_alert
from outbox_pipelines.defs.backfill import backfill_jobs
from outbox_pipelines.defs.checks import CHECKS_JOB, assets_and_checks
from outbox_pipelines.defs.maintenance import maintenance_jobs
from outbox_pipelines.defs.relay import relay_group_job_name, relay_jobs
from outbox_pipelines.defs.replay import replay_jobs
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines.defs.schedules import backlog_sensor, maintenance_schedules, relay_schedules
from outbox_pipelines.defs.skip import skip_jobs

# Set by `dg check defs` and `dagster definitions validate` while they load the code location (Dagster's own).
VALIDATION_ENV = "DAGSTER_IS_DEFS_VALIDATION_CLI"
SETTINGS = load_settings()
if os.environ.get(VALIDATION_ENV) == "1":
    # `dg check defs` / `dagster definitions validate`: a table whose section cannot be used fails validation
    # with its message. Loaded for running, the code location goes on without it (its relay check says why).
    SETTINGS.check()
# Every table, those whose section cannot be used included (an asset whose relay check says why).
TABLES = sorted({*SETTINGS.tables, *(name for name in SETTINGS.broken if is_valid_table_name(name))})
GROUPS = {group: relayed for group, tables in SETTINGS.groups().items()
          if (relayed := [t for t in tables if SETTINGS.tables[t].relay_enabled])}


def build_definitions(resources: Mapping[str, Any] | None = None) -> dg.Definitions:
    """The code location; tests and the demo pass their own resources (``outbox_resources(url, config_path)``)."""
    jobs = relay_jobs(GROUPS) + maintenance_jobs() + replay_jobs() + skip_jobs() + backfill_jobs()
    by_name = {job.name: job for job in jobs}
    assets, checks = assets_and_checks(TABLES)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[*jobs, CHECKS_JOB],
        schedules=relay_schedules(GROUPS, by_name) + maintenance_schedules(by_name),
        sensors=[backlog_sensor(group, tables, by_name[relay_group_job_name(group)])
                 for group, tables in sorted(GROUPS.items())] + [oncall_sensor, run_failure_alert],
        # The deployment's: the environment, or what a caller passes (outbox_resources(url=..., config_path=...)).
        resources=dict(resources) if resources is not None else outbox_resources(),
    )


defs = build_definitions()
