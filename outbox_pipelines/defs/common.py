"""Helpers shared by the ops: turning core errors into clear run failures, metadata values."""

from typing import Any

import dagster as dg

from outbox_pipelines.core.errors import ConfigError, InvalidTableName, UnknownTable
from outbox_pipelines.core.settings import Settings, TableSettings

# Maintenance and the checks job go ahead of relay runs in Dagster's run queue (and dagster.yaml keeps slots that
# relay runs cannot take): with 50 tables relaying, requeue-stuck, clean and the checks still start on time.
MAINTENANCE_TAGS = {"dagster/priority": "10"}


def table_asset_key(table_name: str) -> dg.AssetKey:
    return dg.AssetKey(["outbox", table_name])


def resolve_table(settings: Settings, table_name: str) -> TableSettings:
    """The table's settings, or a run failure that says which tables exist and where to add one."""
    try:
        return settings.table(table_name)
    except (UnknownTable, InvalidTableName, ConfigError) as exc:
        raise dg.Failure(
            description=str(exc),
            metadata={"table": table_name, "known_tables": ", ".join(sorted(settings.tables))},
            allow_retries=False,
        ) from None


def metadata_values(values: dict[str, Any]) -> dict[str, Any]:
    """Dagster metadata from plain values: None becomes the text '-', dicts become JSON."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            out[key] = dg.MetadataValue.text("-")
        elif isinstance(value, (dict, list)):
            out[key] = dg.MetadataValue.json(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(round(value, 4))
        else:
            out[key] = value
    return out
