"""The command line's value types: the replay filters' (row id, time of death; core/operations/replay.py, imported
when one is given), and the core's shared ones (core/settings/arguments.py) under the names the parser uses."""

import argparse
from collections.abc import Callable
from typing import Any

from outbox_pipelines.core.settings.arguments import (
    bind_host,
    duration,
    operator_text,
    port,
    server_port,
    whole_number,
)

__all__ = ["bind_host", "death_time", "duration", "operator_text", "port", "row_id", "server_port", "whole_number"]


def row_id(value: str) -> int:
    from outbox_pipelines.core.operations.replay import ReplayRefused, check_row_id

    try:
        return check_row_id(int(value))
    except ValueError as exc:  # ReplayRefused is a ValueError too
        message = str(exc) if isinstance(exc, ReplayRefused) else f"{value!r} is not a row id (a whole number)"
        raise argparse.ArgumentTypeError(message) from None


def death_time(name: str) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        from outbox_pipelines.core.operations.replay import ReplayRefused, parse_death_time

        try:
            return parse_death_time(value, name)
        except ReplayRefused as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "time"
    return parse
