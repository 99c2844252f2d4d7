"""The service's Dagster code location: every component under defs/ (the outbox's is defs/outbox/defs.yaml)."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
