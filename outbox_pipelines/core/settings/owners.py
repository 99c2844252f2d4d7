"""A project relays only the outbox tables it owns (core/storage/table_owners.py): the relays of the CLI and of
Dagster set aside every table another project owns, with the owner named, as they set aside a table whose section
cannot be used."""

from contextlib import nullcontext
from dataclasses import replace

import psycopg

from outbox_pipelines.core.settings.loading import Settings
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table_owners import owners


def owned_elsewhere(url: str, settings: Settings, conn: psycopg.Connection | None = None) -> dict[str, str]:
    """Each of ``settings``' tables another project owns, with what to tell about it (on ``conn`` if given)."""
    if not settings.tables:
        return {}
    with nullcontext(conn) if conn is not None else connect(url) as on:
        recorded = owners(on, settings.tables)
    project = settings.project
    return {name: owner.refusal(project) for name, owner in recorded.items() if owner.project != project}


def without_tables_owned_elsewhere(url: str, settings: Settings, conn: psycopg.Connection | None = None) -> Settings:
    """``settings`` with every table another project owns moved to ``broken``, saying whose it is."""
    foreign = owned_elsewhere(url, settings, conn)
    if not foreign:
        return settings
    return replace(
        settings,
        tables={name: table for name, table in settings.tables.items() if name not in foreign},
        broken={**settings.broken, **foreign},
        broken_groups={**settings.broken_groups, **{name: settings.tables[name].group for name in foreign}},
    )
