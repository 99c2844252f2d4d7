"""Whether a table's destination is failing, as its relays see it (``outbox_destination_health``).

An outage must show while it lasts. A relay run during a broker outage claims,
fails and retries; nothing in the message counts looks wrong until messages die
hours later. So each relay records, after every batch, whether the destination
itself failed (connection refused, timeout, 5xx, 401, an unreadable answer) and
nothing was delivered; the first success ends the streak. The ``destination``
check grades how long the streak has lasted. Throttling (429) and failures of
one message (400, handler errors) are not destination failures.
"""

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome, cap_error
from outbox_pipelines.core.queries import shared_query
from outbox_pipelines.core.redaction import redact_text

log = logging.getLogger("outbox_pipelines.destination_health")

DESTINATION_FAILURES = frozenset({m.NETWORK_TIMEOUT, m.BROKER_5XX, m.UNAUTHORIZED, m.UNKNOWN})
# A healthy relay confirms "still delivering" this often, so a streak another relay opened closes soon.
SUCCESS_EVERY_S = 5.0


def display_name(name: str) -> str:
    """A destination's name as shown to people: any URL in it without its credentials."""
    return redact_text(name)


def destination_failures(outcomes: Sequence[Outcome]) -> tuple[int, Counter[str]]:
    """(deliveries that succeeded, destination failures by code) of one batch."""
    delivered = sum(1 for o in outcomes if o.kind == "sent" and o.code != m.DEDUP_HIT)
    failures = Counter(o.code for o in outcomes if o.kind != "sent" and o.code in DESTINATION_FAILURES)
    return delivered, failures


class HealthRecorder:
    """Records one relay's view of its destination: every failing batch, and successes when they matter."""

    def __init__(self, table: str, destination: str) -> None:
        self.table = table
        self.destination = display_name(destination)
        self._streak_open: bool | None = None  # unknown until the first write
        self._last_success_write = float("-inf")

    def observe(self, conn: psycopg.Connection, outcomes: Sequence[Outcome]) -> None:
        delivered, failures = destination_failures(outcomes)
        try:
            if delivered:
                if self._streak_open is not False or time.monotonic() - self._last_success_write >= SUCCESS_EVERY_S:
                    conn.execute(shared_query("outbox_destination_health_success"),
                                 {"table_name": self.table, "destination": self.destination})
                    self._streak_open = False
                    self._last_success_write = time.monotonic()
            elif failures:
                last = next((o.error for o in outcomes if o.code in DESTINATION_FAILURES and o.error), None)
                conn.execute(shared_query("outbox_destination_health_failure"), {
                    "table_name": self.table, "destination": self.destination, "failures": sum(failures.values()),
                    "codes": Jsonb(dict(failures)), "error": cap_error(redact_text(last) if last else None),
                })
                self._streak_open = True
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:  # never let bookkeeping stop deliveries
            log.warning("could not record the health of %s's destination: %s", self.table, exc)


@dataclass(frozen=True)
class DestinationHealth:
    table: str
    destination: str | None = None
    failing_for_s: float | None = None
    consecutive_failures: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    last_success_at: datetime | None = None

    @property
    def failing(self) -> bool:
        return self.failing_for_s is not None


def read_health(conn: psycopg.Connection, table: str, now: datetime | None = None) -> DestinationHealth:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query("outbox_destination_health_read"), {"table_name": table, "now": now})
        row: dict[str, Any] | None = cur.fetchone()
    if row is None:
        return DestinationHealth(table)
    return DestinationHealth(
        table, row["destination"], row["failing_for_s"], row["consecutive_failures"],
        {k: int(v) for k, v in (row["error_codes"] or {}).items()}, row["last_error"], row["last_success_at"],
    )
