"""The contract every destination fulfils, with a default for every extension point.

The relay talks to a destination only through this class: a destination
subclasses it and overrides what it needs. Nothing is probed with ``getattr``.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import psycopg

from outbox_pipelines.core.models import ClaimedMessage, Outcome

if TYPE_CHECKING:  # the settlement type is the table's; imported for annotations only
    from outbox_pipelines.core.storage.table import Settlement


def server_of(url: str, default_port: int | None = None) -> tuple[str, int | None] | None:
    """(host, port) of a URL or ``host:port``: its hostname alone (never its user-info), the port or
    ``default_port``; None when it has no host."""
    try:
        parts = urlsplit(url if "://" in url else f"//{url}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    return (host, port if port is not None else default_port) if host else None


class Destination:
    """Delivers a batch and says, per message, what happened.

    ``deliver`` never raises for a message's own failure: it returns an Outcome
    (sent / retry / dead) for every message, in order.
    """

    name: str = "destination"
    # True when deliveries wait on the network: the relay then claims and settles the
    # next batch while this one is in flight.
    pipelined: bool = False
    # True when after_settle writes to the database: the relay then settles in one transaction with it;
    # otherwise the settle is one autocommit statement.
    writes_on_settle: bool = False
    # The send span's messaging.system (docs/how-to/traces.md): the broker's kind; "outbox" in process.
    messaging_system: str = "outbox"
    # (host, port) the destination was configured with, for server.address / server.port; never credentials.
    server: tuple[str, int | None] | None = None

    def destination_name(self, message: ClaimedMessage) -> str:
        """Where ``message`` goes, in the broker's words (messaging.destination.name): its topic by default."""
        return message.topic

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        raise NotImplementedError

    @property
    def paused_topics(self) -> tuple[str, ...]:
        """Topics this destination cannot take now (read at every claim); none by default."""
        return ()

    def after_settle(self, conn: psycopg.Connection, settled: Sequence[tuple[ClaimedMessage, "Settlement"]]) -> None:
        """Runs after each settle with each settled message and how it ended (in the settle's transaction
        when ``writes_on_settle``); nothing by default."""

    def close(self) -> None:
        """Release what the destination holds (HTTP pools, threads); nothing by default."""
