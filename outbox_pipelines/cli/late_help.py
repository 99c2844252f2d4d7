"""Help texts the parser writes only when they are shown: ``db grant``'s (it names the roles the engine declares)
and ``--version`` (importlib.metadata's look-up); a relay's start pays for neither."""

import argparse
from typing import Any


def grant_help() -> str:
    """``db grant``'s description; it names the roles (core/storage/roles.py), read when the help is shown."""
    from outbox_pipelines.core.storage import roles

    return (
        "create the least-privilege group roles (NOLOGIN) and grant each its rights on the outbox tables: "
        f"{', '.join(roles.role_names())}. Run it as the tables' owner with CREATEROLE (or a superuser), after "
        "'db upgrade', and again after every 'db create-table' so the roles reach the new table; safe to repeat "
        "(each run revokes and grants the declared set). Then put each login role in its group, e.g. "
        "GRANT outbox_relay TO relay_login."
    )


GRANT_HELP_LATER = "(db grant: grant_help())"


class GrantHelpFormatter(argparse.HelpFormatter):
    """Writes ``grant_help()`` where ``db grant``'s parser holds its placeholder: other commands never read it."""

    def add_text(self, text: str | None) -> None:
        super().add_text(grant_help() if text == GRANT_HELP_LATER else text)


class ShowVersion(argparse.Action):
    """``--version``: the installed version, read only when asked (importlib.metadata's look-up)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        from outbox_pipelines import __version__

        print(f"outbox-pipelines {__version__}")
        parser.exit()
