"""``outbox-pipelines init``: a project's first ``outbox.toml``, the example that lists every key, and the example
project to copy a layout from, all from the installed package (a team that installed the wheel has no checkout
to copy them from)."""

import argparse
import re
import shutil
from pathlib import Path

from outbox_pipelines.cli.output import EXIT_OK, UsageError
from outbox_pipelines.core.storage.db import project_root
from outbox_pipelines.core.storage.project_dir import project_name

STARTER = """\
# The outbox tables of {project} (written by `outbox-pipelines init`). Every key, with what it does:
# `outbox-pipelines init --print-example`. Then `outbox-pipelines db upgrade` creates each table declared here.

[tables.{table}]
# "paper" marks every message sent and delivers it nowhere (the relay, status and the checks say so): name
# where its messages go before production, e.g. destination = "http" with url = "https://...".
destination = "paper"
mode = "competing"
"""


def _shipped(in_checkout: str, in_wheel: str) -> Path:
    """A file or directory of the checkout (``in_checkout``), or its copy packaged inside the wheel."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / in_checkout, here.parents[1] / in_wheel):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"cannot find {in_checkout} in the installed outbox_pipelines")


def example_config_path() -> Path:
    """outbox.example.toml in a source checkout, or the copy packaged inside the wheel."""
    return _shipped("outbox.example.toml", "_outbox.example.toml")


def copy_example_project(target: Path) -> Path:
    """examples/billing_service (a Dagster project with its own package, tables and OutboxComponent) into
    ``target``, which must not exist yet or be empty."""
    if target.exists() and any(target.iterdir()):
        raise UsageError(f"{target} is not empty: nothing copied (name a new directory)")
    source = _shipped("examples/billing_service", "_examples/billing_service")
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", ".outbox", "*.egg-info")
    try:
        shutil.copytree(source, target, ignore=ignored, dirs_exist_ok=True)
    except OSError as exc:  # a directory that cannot be made there (no parent, not writable, not a directory)
        raise UsageError(f"cannot copy the example project into {target}: {exc.strerror or exc}") from None
    return target


def cmd_init(args: argparse.Namespace) -> int:
    if args.print_example:
        print(example_config_path().read_text(), end="")
        return EXIT_OK
    if args.example_project:
        target = copy_example_project(Path(args.example_project))
        print(
            f"copied the example project to {target}: cd there, pip install -e . beside outbox_pipelines[dagster], "
            "set OUTBOX_DATABASE_URL and BILLING_WEBHOOK_URL, then outbox-pipelines db upgrade and dg check defs"
        )
        return EXIT_OK
    root = project_root()
    target = root / "outbox.toml"
    if target.exists():
        raise UsageError(f"{target} exists already: nothing written (edit it, or remove it to start afresh)")
    project = project_name()
    stem = re.sub(r"[^a-z0-9_]+", "_", project.lower()).strip("_") or "app"
    table = args.table or (stem if stem.endswith("outbox") else f"{stem}_outbox")
    from outbox_pipelines.core.names import validate_table_name

    validate_table_name(table)
    target.write_text(STARTER.format(project=project, table=table))
    print(f"wrote {target}, declaring the table {table}; next: outbox-pipelines db upgrade")
    return EXIT_OK
