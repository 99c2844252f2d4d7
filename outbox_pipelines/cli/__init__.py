"""outbox-pipelines: the command line of the outbox.

Exit codes: 0 done; 1 failed (database unreachable, migration error, ...); 2 bad input or usage (nothing was
written). Here: ``main``, which parses, runs the command and turns its errors into exit codes; the rules are the
core's. The modules: docs/explanation/codebase.md, "The command line's modules".
"""

import logging
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any

import psycopg

from outbox_pipelines.cli import handlers
from outbox_pipelines.cli.inputs import unusable_tables
from outbox_pipelines.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, say
from outbox_pipelines.cli.parser import Handler, build_parser
from outbox_pipelines.cli.read_only import read_only_deadline
from outbox_pipelines.core.errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidTableName,
    MigrationError,
    UnknownTable,
)
from outbox_pipelines.core.extras import missing_extra
from outbox_pipelines.core.redaction import redact_text

if TYPE_CHECKING:
    from outbox_pipelines.cli.db_commands import (
        cmd_db_create_table,
        cmd_db_grant,
        cmd_db_stop,
        cmd_db_upgrade,
        cmd_db_url,
    )
    from outbox_pipelines.cli.enqueue_command import cmd_enqueue
    from outbox_pipelines.cli.oncall_commands import blocked_keys_text, cmd_status
    from outbox_pipelines.cli.operations_commands import cmd_clean, cmd_replay, cmd_requeue_stuck, cmd_skip
    from outbox_pipelines.cli.relay_commands import cmd_relay
    from outbox_pipelines.cli.servers import cmd_broker_sim, cmd_demo, cmd_dev, cmd_order_api


def __getattr__(name: str) -> Any:
    """The commands' functions, found here as before, each module imported on first use: the module cli/handlers.py
    names for it (a relay process imports none of the other commands' modules)."""
    if name == "GRANT_HELP":
        from outbox_pipelines.cli.late_help import grant_help

        return grant_help()
    if name == "blocked_keys_text":
        from outbox_pipelines.cli.oncall_commands import blocked_keys_text

        return blocked_keys_text
    command = getattr(handlers, name, None)
    if isinstance(command, handlers.Command):
        return getattr(import_module(command.module), command.function)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "GRANT_HELP",
    "Handler",
    "UsageError",
    "blocked_keys_text",
    "build_parser",
    "cmd_broker_sim",
    "cmd_clean",
    "cmd_db_create_table",
    "cmd_db_grant",
    "cmd_db_stop",
    "cmd_db_upgrade",
    "cmd_db_url",
    "cmd_demo",
    "cmd_dev",
    "cmd_enqueue",
    "cmd_order_api",
    "cmd_relay",
    "cmd_replay",
    "cmd_requeue_stuck",
    "cmd_skip",
    "cmd_status",
    "main",
    "say",
]


EXIT_BROKEN_PIPE = 141  # what a shell reports for a command its pipe's reader stopped (128 + SIGPIPE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # Handler modules an outbox.toml names next to it import as under `python -m` (the console
    # script alone does not put the working directory on the path).
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        with read_only_deadline(args):  # status, db status, a dry run: bounded (cli/read_only.py)
            code = int(args.handler(args) or 0) or unusable_tables(args)
        sys.stdout.flush()  # here, not at exit: a reader that stopped early is one more case below
        return code
    except (UsageError, InvalidMessage, InvalidTableName, UnknownTable, ConfigError) as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except (DatabaseUnavailable, MigrationError) as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except psycopg.Error as exc:
        if args.verbose:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        say(f"error: the database refused: {redact_text(first)} (rerun with -v for the traceback)")
        return EXIT_FAILED
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:  # `status | head`: the reader has what it wanted; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ModuleNotFoundError as exc:
        needed = missing_extra(exc)
        if needed is None:
            raise
        say(f"error: {needed}")
        return EXIT_FAILED
