"""Dagster's own storage on PostgreSQL, found the way `outbox-pipelines dev` finds it.

dagster.yaml names ``OutboxDagsterStorage``, so a Dagster command typed in the project needs no variable:
``OUTBOX_DAGSTER_PG_URL``, else ``<outbox db>_dagster`` beside the outbox's database (the embedded one brought
up to date). Why: docs/explanation/front-ends.md, "Dagster's own storage".
"""

import os
import sys
from typing import Any

from dagster import Field
from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage

from outbox_pipelines.core.operations import upgrade
from outbox_pipelines.core.settings import load_settings_or_problem
from outbox_pipelines.core.storage import db
from outbox_pipelines.core.storage.database_url import refuse_two_way_url
from outbox_pipelines.defs.dagster_home import DAGSTER_PG_URL_ENV, dagster_storage_url

# Set once the message is out: the webserver, daemon and run workers a command starts inherit
# it and stay quiet, so one command says it once.
_ANNOUNCED_ENV = "_OUTBOX_DAGSTER_STORAGE_ANNOUNCED"
# The embedded database brought up to date by this command: the processes it starts (webserver,
# daemon, every run worker) inherit it and skip the migration check instead of repeating it.
_MIGRATED_ENV = "_OUTBOX_EMBEDDED_MIGRATED"


def resolve_storage_url() -> tuple[str, str]:
    """(the psycopg2 URL Dagster's storage uses, where it came from, for people)."""
    explicit = os.environ.get(DAGSTER_PG_URL_ENV)
    if explicit:
        refuse_two_way_url(explicit)  # "percent-encode the password", before Dagster's driver reads a host out of it
        return explicit, DAGSTER_PG_URL_ENV
    outbox = db.resolve_database(announce=False)
    if not outbox.embedded:
        return dagster_storage_url(outbox.url), f"on the server of {db.DATABASE_URL_ENV}"
    applied: list[str] = []
    if os.environ.get(_MIGRATED_ENV) != outbox.url:
        applied = upgrade.upgrade_project(outbox.url, load_settings_or_problem()).applied
        os.environ[_MIGRATED_ENV] = outbox.url
    where = f"on the embedded PostgreSQL under {db.embedded_dir()}, left running: 'outbox-pipelines db stop' stops it"
    if applied:
        where += f"; outbox migrations applied: {', '.join(applied)}"
    return dagster_storage_url(outbox.url), where


def _announce(url: str, source: str) -> None:
    """Say which database Dagster uses unless it was named explicitly; on stderr, so stdout stays the command's."""
    if source == DAGSTER_PG_URL_ENV or os.environ.get(_ANNOUNCED_ENV):
        return
    print(f"Dagster storage: {db.mask_url(url)}, {source}", file=sys.stderr, flush=True)
    os.environ[_ANNOUNCED_ENV] = "1"


class OutboxDagsterStorage(DagsterPostgresStorage):
    """dagster-postgres' storage with the URL resolved as above rather than read from dagster.yaml."""

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        return {"should_autocreate_tables": Field(bool, is_required=False, default_value=True)}

    @classmethod
    def from_config_value(  # type: ignore[override]  # our config has no URL fields
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, Any]
    ) -> "OutboxDagsterStorage":
        url, source = resolve_storage_url()
        _announce(url, source)
        return cls(
            postgres_url=url,
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            inst_data=inst_data,
        )

    # dagster-postgres describes its three storages with its own config, which here holds
    # no URL: nothing in Dagster reads these, and a wrong description is worse than none.
    @property
    def event_storage_data(self) -> ConfigurableClassData | None:
        return None

    @property
    def run_storage_data(self) -> ConfigurableClassData | None:
        return None

    @property
    def schedule_storage_data(self) -> ConfigurableClassData | None:
        return None
