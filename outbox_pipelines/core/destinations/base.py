"""The contract every destination fulfils."""

from collections.abc import Sequence
from typing import Protocol

from outbox_pipelines.core.models import ClaimedMessage, Outcome


class Destination(Protocol):
    """Delivers a batch and says, per message, what happened.

    ``deliver`` never raises for a message's own failure: it returns an Outcome
    (sent / retry / dead) for every message, in order.
    """

    name: str

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]: ...

    def close(self) -> None: ...
