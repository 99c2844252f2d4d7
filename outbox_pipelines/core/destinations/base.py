"""The contract every destination fulfils, with a default for every extension point.

The relay talks to a destination only through this class: a destination
subclasses it and overrides what it needs. Nothing is probed with ``getattr``.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import psycopg

from outbox_pipelines.core.models import ClaimedMessage, Outcome

if TYPE_CHECKING:  # the settlement type is the table's; imported for annotations only
    from outbox_pipelines.core.storage.table import Settlement


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
