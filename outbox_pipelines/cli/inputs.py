"""Where a command's inputs come from: the database URL, the table settings (``--config``), and which tables
it works on (``--table``, else every usable one; the unusable ones are told at the end)."""

import argparse
import os
import sys

from outbox_pipelines.cli.output import EXIT_OK, EXIT_USAGE, say
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings
from outbox_pipelines.core.storage import db, schema_version


def database_url(*, schema_checked: bool = True) -> str:
    """The database the command works on; unless ``schema_checked`` is False (the ``db`` commands, which look at or
    change the schema), refused with one message when its schema is older than this code needs."""
    url = db.resolve_database(announce=True).url
    if schema_checked:
        schema_version.require_current_schema(url)
    return url


def settings_of(args: argparse.Namespace) -> Settings:
    if getattr(args, "config", None):
        os.environ["OUTBOX_CONFIG"] = args.config
    # The project's own modules (its handlers) import from its root, as Dagster imports them from the
    # code location's working directory: a console script's sys.path does not hold the working directory.
    root = str(db.project_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    return load_settings()


def chosen_tables(args: argparse.Namespace, settings: Settings) -> list[TableSettings]:
    """The tables a command that never delivers works on (status, requeue-stuck, clean): those named by --table
    (repeatable), else every usable table in name order, a table whose credential variable is not set here
    included (``Settings.for_operations``); a table whose section cannot be used is then told at the end, and
    the command exits 2 (``main``)."""
    chosen = getattr(args, "table", None)
    if not chosen:
        args.unusable_tables = settings.broken_for_operations
    names = chosen or sorted([*settings.tables, *settings.without_secrets])
    return [settings.for_operations(table_name) for table_name in names]


def unusable_tables(args: argparse.Namespace) -> int:
    """Say which tables the command left out because their settings cannot be used: exit 2 if any."""
    return say_left_out(getattr(args, "unusable_tables", {}))


def say_left_out(broken: dict[str, str]) -> int:
    """One line per table left out (``Settings.broken``: table → why), on stderr; the exit code: 2 if any."""
    for name in sorted(broken):
        say(f"error: {name} was left out: {broken[name]}")
    return EXIT_USAGE if broken else EXIT_OK
