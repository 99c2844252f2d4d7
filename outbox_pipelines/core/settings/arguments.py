"""Command-line value types in the core's own words and bounds (settings/values.py), shared by the CLI's parser
and the broker simulator's options: argparse tells a bad value as a usage error (exit 2, one sentence)."""

import argparse
import socket
from collections.abc import Callable

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings.values import MAX_WHOLE, free_text, parse_duration


def duration(value: str) -> float:
    """A duration ("30s", "10m", "168h", or plain seconds): finite, not negative, at most 100 years (a budget
    of ``nan`` or ``inf`` would never end)."""
    try:
        return parse_duration(value, "duration")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def whole_number(minimum: int = 1, maximum: int = MAX_WHOLE) -> Callable[[str], int]:
    """A whole number from ``minimum`` to ``maximum`` (a batch size, a count of messages)."""

    def parse(value: str) -> int:
        try:
            number = int(value.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not minimum <= number <= maximum:
            raise argparse.ArgumentTypeError(f"{number} is not a whole number from {minimum} to {maximum}")
        return number

    parse.__name__ = "whole number"
    return parse


port = whole_number(1, 65535)
port.__name__ = "port"
# A server's own port: 0 asks the system for a free one (the server says which it got).
server_port = whole_number(0, 65535)
server_port.__name__ = "port"


def operator_text(value: str) -> str:
    """Free text an operator gives (a skip's reason), kept in the audit: one printable line."""
    try:
        return free_text(value, "the text")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bind_host(value: str) -> str:
    """An address a server may listen on: an IP address or a name that resolves (``999.1.1.1`` is refused here,
    not as a traceback when the server binds)."""
    try:
        socket.getaddrinfo(value, None, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise argparse.ArgumentTypeError(f"{value!r} is not an address to listen on ({reason})") from None
    return value
