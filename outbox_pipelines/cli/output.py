"""What every command shares on its way out: the exit codes, the usage error, the stderr channel, short
durations, and the ``outbox-pipelines ...`` prefix of the commands it suggests.

Results go to stdout (``print``), what happens along the way and errors to stderr (``say``), so a script
reads one and a person the other.
"""

import argparse
import shlex
import sys

from outbox_pipelines.core.errors import OutboxError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(OutboxError):
    pass


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def command_prefix(args: argparse.Namespace) -> list[str]:
    """The start of a suggested command line: the same --config as this run, so it runs as printed."""
    return ["outbox-pipelines"] + (["--config", args.config] if getattr(args, "config", None) else [])


def shell_prefix(args: argparse.Namespace) -> str:
    return shlex.join(command_prefix(args))
