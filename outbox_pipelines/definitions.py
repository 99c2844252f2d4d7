"""The Dagster code location of outbox_pipelines: one explicit Definitions.

Tables come from the same settings as the CLI (built-in defaults, OUTBOX_CONFIG);
the database from OUTBOX_DATABASE_URL or the embedded default.
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg

# Importing outbox_pipelines.defs first silences Dagster's beta/supersession notices (defs/__init__.py).
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.defs.alerts import oncall_sensor, run_failure_alert
from outbox_pipelines.defs.backfill import backfill_jobs
from outbox_pipelines.defs.checks import CHECKS_JOB, assets_and_checks
from outbox_pipelines.defs.maintenance import maintenance_jobs
from outbox_pipelines.defs.relay import relay_job_name, relay_jobs
from outbox_pipelines.defs.replay import replay_jobs
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines.defs.schedules import backlog_sensor, maintenance_schedules, relay_schedules

SETTINGS = load_settings()
TABLES = sorted(SETTINGS.tables)
RELAYED = [t for t in TABLES if SETTINGS.tables[t].relay_enabled]


def build_definitions(resources: Mapping[str, Any] | None = None) -> dg.Definitions:
    """The code location; tests and the demo pass their own resources (``outbox_resources(url, config_path)``)."""
    jobs = relay_jobs(TABLES) + maintenance_jobs() + replay_jobs() + backfill_jobs()
    by_name = {job.name: job for job in jobs}
    assets, checks = assets_and_checks(TABLES)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[*jobs, CHECKS_JOB],
        schedules=relay_schedules(RELAYED, by_name) + maintenance_schedules(by_name),
        sensors=[backlog_sensor(t, by_name[relay_job_name(t)]) for t in RELAYED]
        + [oncall_sensor, run_failure_alert],
        # The deployment's: the environment, or what a caller passes (outbox_resources(url=..., config_path=...)).
        resources=dict(resources) if resources is not None else outbox_resources(),
    )


defs = build_definitions()
