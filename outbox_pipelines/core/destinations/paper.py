"""The paper broker: accepts everything, executes nothing; the default destination."""

import threading
from collections.abc import Sequence

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome


class PaperBroker(Destination):
    name = "paper"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.delivered: dict[str, int] = {}

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        outcomes = []
        with self._lock:
            for message in messages:
                count = self.delivered.get(message.event_id, 0) + 1
                self.delivered[message.event_id] = count
                outcomes.append(Outcome.sent(ref=f"paper-{message.payload_sha[7:19]}"))
        return outcomes
