"""Building the parser of the one command a command line names (``relay``: not the twenty others, ~10 ms of argparse
at a process's start); a command line that names none (``--help``, ``--version``, a typo) gets the whole tree."""

from collections.abc import Sequence
from typing import Any


def named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names after the top-level options (``--config FILE``, ``-v``); None for anything else."""
    args = iter(argv)
    for arg in args:
        if arg == "--config":
            next(args, None)
        elif not (arg.startswith("--config=") or arg in ("-v", "--verbose")):
            return None if arg.startswith("-") else arg
    return None


class OneCommand:
    """The top-level subparsers, building only ``wanted``'s parser; ``built`` tells whether the tree had it."""

    def __init__(self, subparsers: Any, wanted: str | None) -> None:
        self.subparsers, self.wanted, self.built = subparsers, wanted, False

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if self.wanted is not None and name != self.wanted:
            return Unbuilt()
        self.built = True
        return self.subparsers.add_parser(name, **kwargs)


class Unbuilt:
    """Stands for a command's parser left unbuilt: whatever the tree adds to it goes nowhere."""

    def __getattr__(self, _: str) -> Any:
        return lambda *_args, **_kwargs: self
