"""Read-only commands (``status``, ``db status``, a ``replay`` or ``skip`` ``--dry-run``) end within
``OUTBOX_COMMAND_TIMEOUT_S`` whatever the database does: past it, one sentence and exit 1, never a hang
(core/deadlines.py)."""

import argparse
from contextlib import AbstractContextManager, nullcontext

from outbox_pipelines.cli.handlers import cmd_db_status, cmd_replay, cmd_skip, cmd_status
from outbox_pipelines.core.deadlines import command_deadline


def read_only_command(args: argparse.Namespace) -> str | None:
    """The command line's name when it only reads (``status``, ``db status``, ``replay --dry-run``), else None."""
    handler = getattr(args, "handler", None)
    if handler is cmd_status:
        return "status"
    if handler is cmd_db_status:
        return "db status"
    if handler in (cmd_replay, cmd_skip) and getattr(args, "dry_run", False):
        return f"{args.command} --dry-run"
    return None


def read_only_deadline(args: argparse.Namespace) -> AbstractContextManager[object]:
    """The deadline of a read-only command; nothing for the others (a relay's stop is bounded by its own)."""
    name = read_only_command(args)
    return command_deadline(f"outbox-pipelines {name}") if name else nullcontext()
