"""``outbox-pipelines init``: a project's first ``outbox.toml``, and the example that lists every key, from the
installed package (a team that installed the wheel has no checkout to copy it from)."""

import argparse
import re
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


def example_config_path() -> Path:
    """outbox.example.toml in a source checkout, or the copy packaged inside the wheel."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "outbox.example.toml", here.parents[1] / "_outbox.example.toml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("cannot find outbox.example.toml in the installed outbox_pipelines")


def cmd_init(args: argparse.Namespace) -> int:
    if args.print_example:
        print(example_config_path().read_text(), end="")
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
