"""How one claimed row ends (``Settlement``) and the status a settle writes (``SettleStatus``): what the relay
decides (relay/settlement.py) and the claims module writes (storage/table_claims.py)."""

from dataclasses import dataclass
from enum import StrEnum

from outbox_pipelines.core.models import MessageState


class SettleStatus(StrEnum):
    """What a settle writes: a message's stored state, or ``deleted`` (a table whose sent rows are deleted)."""

    PENDING = MessageState.PENDING.value
    SENT = MessageState.SENT.value
    DEAD = MessageState.DEAD.value
    DELETED = "deleted"


@dataclass(frozen=True)
class Settlement:
    """How one claimed row ends: its new status."""

    id: int
    attempts: int
    status: SettleStatus
    audit_code: str
    delay_s: float = 0.0
    error_code: str | None = None
    error: str | None = None
    ref: str | None = None
    # Give back the attempt counted at claim (throttling, or the circuit was open): not the message's fault.
    refund: bool = False
