"""The Dagster code location of this repository: one explicit Definitions (defs.factory's).

Tables come from the same settings as the CLI: OUTBOX_CONFIG or the project's outbox.toml, with the
shipped tables of the seeds (the demo's); the database from OUTBOX_DATABASE_URL or the embedded default.
A project of its own declares its tables with ``OutboxComponent`` (defs.yaml) or ``outbox_definitions``.
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg

# Importing outbox_pipelines.defs first silences Dagster's beta/supersession notices (defs/__init__.py).
from outbox_pipelines.defs.factory import VALIDATION_ENV, build_from_settings, load_project_settings
from outbox_pipelines.defs.resources import outbox_resources

SETTINGS = load_project_settings(None)
__all__ = ["SETTINGS", "VALIDATION_ENV", "build_definitions", "defs"]


def build_definitions(resources: Mapping[str, Any] | None = None) -> dg.Definitions:
    """The code location; tests and the demo pass their own resources (``outbox_resources(url, config_path)``)."""
    return build_from_settings(SETTINGS, resources if resources is not None else outbox_resources())


defs = build_definitions()
