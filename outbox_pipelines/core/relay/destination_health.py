"""Whether a table's destination is failing, as its relays see it (``outbox_destination_health``).

After every batch a relay records whether the destination itself failed with nothing delivered (a streak the
first success ends); the ``destination`` check grades how long it has lasted. Throttling and one message's
failures are not destination failures. Why: docs/explanation/on-call.md.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import psycopg

from outbox_pipelines.core import models as m
from outbox_pipelines.core.models import Outcome, cap_error
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.storage.paused_topics import BY_HANDLERS, BY_SETTINGS
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables

log = logging.getLogger("outbox_pipelines.destination_health")

DESTINATION_FAILURES = m.NETWORK_FAILURES | {m.BROKER_5XX, m.UNAUTHORIZED, m.UNKNOWN}
# Why a relay holds off while another message probes the open circuit (its pause's reason).
CIRCUIT_WAIT = "circuit open: waiting for the next probe"
# A healthy relay confirms "still delivering" this often, so a streak another relay opened closes soon.
SUCCESS_EVERY_S = 5.0

Written = TypeVar("Written")


def display_name(name: str) -> str:
    """A destination's name as shown to people: any URL in it without its credentials."""
    return redact_text(name)


def destination_failures(outcomes: Sequence[Outcome]) -> tuple[int, Counter[str]]:
    """(deliveries that succeeded, destination failures by code) of one batch."""
    delivered = sum(1 for o in outcomes if o.kind == m.OutcomeKind.SENT and o.code != m.DEDUP_HIT)
    failures = Counter(o.code for o in outcomes if o.kind != m.OutcomeKind.SENT and o.code in DESTINATION_FAILURES)
    return delivered, failures


@dataclass(frozen=True)
class Gate:
    """What a relay may claim now, by the table's shared pause and circuit."""

    wait_s: float = 0.0  # hold off this long before asking again
    limit: int | None = None  # at most this many (1: a probe); None: a full batch
    circuit_open: bool = False
    reason: str = ""


OPEN = Gate()


class DestinationGuard:
    """One relay's side of the table's shared destination state (``outbox_destination_health``).

    - throttling: a 429 pauses the table for every relay of it, on any host (``pause``);
    - the circuit: ``threshold`` destination failures in a row open it; then one relay at a time
      sends one probe message every ``probe_interval_s``, and failures spend no attempt; the first
      success closes it and makes the messages waiting out a destination-failure backoff due at once;
    - the failure streak the ``destination`` check grades.
    """

    def __init__(
        self,
        table_name: str,
        destination: str,
        *,
        threshold: int = 10,
        probe_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table_name = table_name
        self.destination = display_name(destination)
        self.threshold, self.probe_interval_s = threshold, probe_interval_s
        self.circuit_open = False
        self._throttle_probe = False
        self._streak_open: bool | None = None  # unknown until the first write
        self._clock = clock  # for the success write's interval only (tests pass a fake one)
        self._last_success_write = float("-inf")
        self._paused: dict[str, str] | None = None  # the paused topics last recorded (None: not yet)

    def gate(self, conn: psycopg.Connection, *, now: datetime | None = None) -> Gate:
        """Read before every claim: so every relay honours a pause or an open circuit within one claim."""
        shared = SharedTables(conn)
        row = shared.destination_gate(self.table_name, now=now)
        if row is None:
            self.circuit_open = False
            return OPEN
        db_now = row["now"]
        if row["paused_until"] is not None and row["paused_until"] > db_now:
            return Gate(
                (row["paused_until"] - db_now).total_seconds(),
                0,
                row["circuit_opened_at"] is not None,
                f"paused by the destination ({row['pause_reason'] or '429'})",
            )
        self.circuit_open = row["circuit_opened_at"] is not None
        if not self.circuit_open:
            if row["pause_reason"] is not None:
                # A pause just ended: one message first, not a full batch into a destination that may
                # still be throttling; the first success lifts the throttle for every relay.
                self._throttle_probe = True
                return Gate(0.0, 1, False, "throttled: one message first")
            return OPEN
        if shared.take_destination_probe(self.table_name, probe_interval_s=self.probe_interval_s, now=now):
            return Gate(0.0, 1, True, "circuit open: sending one probe")
        wait = (row["next_probe_at"] - db_now).total_seconds() if row["next_probe_at"] else self.probe_interval_s
        return Gate(max(wait, 0.05), 0, True, CIRCUIT_WAIT)

    def note_paused(
        self,
        conn: psycopg.Connection,
        configured: Sequence[str],
        switched_off: Sequence[str],
        before_write: Callable[[], None] = lambda: None,
    ) -> None:
        """The topics this relay leaves paused (its settings', its handlers' switched off), recorded when they
        change (and once at start), for the lag check and ``status`` (core/storage/paused_topics.py);
        ``before_write`` runs first when they are written."""
        paused = {topic: BY_HANDLERS for topic in switched_off} | {topic: BY_SETTINGS for topic in configured}
        if paused == self._paused:
            return
        before_write()
        if self._quietly(lambda: self._record_paused(conn, paused)):
            self._paused = paused  # not written again (a write per claim before: its None read as "refused")

    def _record_paused(self, conn: psycopg.Connection, paused: dict[str, str]) -> bool:
        SharedTables(conn).record_paused_topics(self.table_name, paused)
        return True

    def saw_open(self) -> None:
        """A claim found the destination plainly open (a gated claim returned rows)."""
        self.circuit_open = False

    def pause(self, conn: psycopg.Connection, delay_s: float, reason: str, *, now: datetime | None = None) -> None:
        """The destination asked to slow down: hold every relay of the table for ``delay_s``."""
        self._quietly(
            lambda: SharedTables(conn).pause_destination(
                self.table_name, destination=self.destination, delay_s=delay_s, reason=reason[:200], now=now
            )
        )

    def observe(self, conn: psycopg.Connection, outcomes: Sequence[Outcome], *, now: datetime | None = None) -> None:
        """Record a delivered batch: a destination failure, or a success that ends a streak."""
        delivered, failures = destination_failures(outcomes)
        if delivered:
            self._observe_success(conn, now)
        elif failures:
            self._observe_failures(conn, outcomes, failures, now)

    def _success_write_due(self) -> bool:
        """A success is written when it ends something (a streak, an open circuit, a throttle) and
        otherwise at most every SUCCESS_EVERY_S: a steady run of deliveries is not a write per batch."""
        return (
            self._streak_open is not False
            or self.circuit_open
            or self._throttle_probe
            or self._clock() - self._last_success_write >= SUCCESS_EVERY_S
        )

    def _observe_success(self, conn: psycopg.Connection, now: datetime | None) -> None:
        was_open = self.circuit_open
        if self._success_write_due():
            self._throttle_probe = False
            written = self._quietly(
                lambda: SharedTables(conn).record_destination_success(
                    self.table_name, destination=self.destination, now=now
                )
            )
            if written:
                self._streak_open = False
                self._last_success_write = self._clock()
        self.circuit_open = False
        if was_open:
            self._retry_now(conn, now)

    def _observe_failures(
        self, conn: psycopg.Connection, outcomes: Sequence[Outcome], failures: Counter[str], now: datetime | None
    ) -> None:
        last = next((o.error for o in outcomes if o.code in DESTINATION_FAILURES and o.error), None)
        opened = self._quietly(
            lambda: SharedTables(conn).record_destination_failures(
                self.table_name,
                destination=self.destination,
                failures=sum(failures.values()),
                codes=dict(failures),
                error=cap_error(redact_text(last) if last else None),
                threshold=self.threshold,
                probe_interval_s=self.probe_interval_s,
                now=now,
            )
        )
        self._streak_open = True
        if opened is not None:
            if opened and not self.circuit_open:
                log.warning(
                    "%s: the circuit opened after %d destination failures in a row (%s); one probe "
                    "message every %.0fs until one succeeds, no attempts spent meanwhile",
                    self.table_name,
                    self.threshold,
                    ", ".join(failures),
                    self.probe_interval_s,
                )
            self.circuit_open = opened

    def _retry_now(self, conn: psycopg.Connection, now: datetime | None) -> None:
        outbox_table = OutboxTable(conn, self.table_name)
        pulled = outbox_table.retry_destination_failures_now(sorted(DESTINATION_FAILURES), now=now)
        log.warning(
            "%s: the circuit closed: the destination answers again; %d messages waiting out a backoff are due now",
            self.table_name,
            pulled,
        )

    def _quietly(self, write: Callable[[], Written]) -> Written | None:
        """Bookkeeping never stops deliveries: a refused write is logged (a lost connection is not ours to hide)."""
        try:
            return write()
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            log.warning("could not record the state of %s's destination: %s", self.table_name, exc)
            return None


@dataclass(frozen=True)
class DestinationHealth:
    table: str
    destination: str | None = None
    failing_for_s: float | None = None
    consecutive_failures: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    last_success_at: datetime | None = None
    paused_for_s: float | None = None
    circuit_opened_at: datetime | None = None
    # Why the table's relay group cannot relay it (core/relay/group.py), and since when; None: it can.
    relay_problem: str | None = None
    relay_problem_since: datetime | None = None

    @property
    def failing(self) -> bool:
        return self.failing_for_s is not None

    @property
    def circuit(self) -> str:
        return "open" if self.circuit_opened_at is not None else "closed"

    @property
    def paused(self) -> bool:
        return self.paused_for_s is not None and self.paused_for_s > 0


def read_health(conn: psycopg.Connection, table_name: str, now: datetime | None = None) -> DestinationHealth:
    row = SharedTables(conn).read_destination_health(table_name, now=now)
    if row is None:
        return DestinationHealth(table_name)
    return DestinationHealth(
        table_name,
        row["destination"],
        row["failing_for_s"],
        row["consecutive_failures"],
        {k: int(v) for k, v in (row["error_codes"] or {}).items()},
        row["last_error"],
        row["last_success_at"],
        row["paused_for_s"],
        row["circuit_opened_at"],
        row["relay_problem"],
        row["relay_problem_since"],
    )
