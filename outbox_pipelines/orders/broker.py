"""The order broker, a Destination (docs/explanation/orders.md): OrderRequest → broker request, ExecResult → ledger.

Every attempt carries the same Idempotency-Key; the timeout follows the order's time in force (2.5 s IOC, 5 s
FOK/GTC). ``after_settle`` records each order's outcome in ``idempo_ledger`` in the settle's transaction (the
failure's code: ``failures.failure_code``). Without a broker URL, the paper broker executes every order.
"""

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.http.destination import Attempt, HttpDestination, HttpRequest
from outbox_pipelines.core.destinations.trace_context import trace_headers
from outbox_pipelines.core.models import ClaimedMessage, Outcome, OutcomeKind
from outbox_pipelines.core.redaction import url_origin
from outbox_pipelines.core.settings.already_processed import STRICT_ALREADY_PROCESSED, AlreadyProcessed
from outbox_pipelines.core.storage.settlements import SettleStatus
from outbox_pipelines.orders.failures import caller_reason, failure_code
from outbox_pipelines.orders.ledger import SettledOrder, record_outcomes
from outbox_pipelines.orders.metrics import ORDER_BROKER_LATENCY
from outbox_pipelines.orders.model import broker_request, broker_timeout_s, exec_result, result_digest

if TYPE_CHECKING:  # annotations only: the settings and the settlement are the engine's
    from outbox_pipelines.core.settings import Settings, TableSettings
    from outbox_pipelines.core.storage.table import Settlement


@dataclass
class _Delivery:
    """What this broker saw of one message, from its request until the relay settles it."""

    started: float | None = None  # perf_counter at the request (the broker latency metric)
    result: dict[str, Any] | None = None  # the ExecResult of a success
    failed_attempt: Attempt | None = None  # what the last failed attempt saw (seed 001's error map)


class OrderBroker(Destination):
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True
    # after_settle records each order's outcome in the ledger: in the settle's transaction.
    writes_on_settle = True

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        max_in_flight: int = 32,
        transport: str = "aiohttp-native",
        already_processed: AlreadyProcessed = STRICT_ALREADY_PROCESSED,
    ) -> None:
        # Keyed by message id; deliveries run on the HTTP threads while the relay settles other batches.
        self._deliveries: dict[int, _Delivery] = {}
        self._lock = threading.Lock()
        self.http = (
            HttpDestination(
                url,
                name=f"order broker {url_origin(url)}",
                max_in_flight=max_in_flight,
                token=token,
                transport=transport,
                build_request=self._request,
                on_result=self._answered,
                already_processed=already_processed,
            )
            if url
            else None
        )
        self.name = self.http.name if self.http else "paper order broker"

    def _delivery(self, message: ClaimedMessage) -> _Delivery:
        """This message's record (call with the lock held)."""
        return self._deliveries.setdefault(message.id, _Delivery())

    def _request(self, message: ClaimedMessage) -> HttpRequest:
        with self._lock:
            self._delivery(message).started = time.perf_counter()
        return HttpRequest(
            body=broker_request(message.payload, message.event_id, message.trace_id),
            headers=trace_headers(message),
            timeout_s=broker_timeout_s(message.payload),
        )

    def _answered(self, message: ClaimedMessage, outcome: Outcome, body: bytes, attempt: Attempt) -> Outcome:
        """HttpDestination's hook after each attempt: the latency, and the ExecResult or what went wrong."""
        with self._lock:
            delivery = self._delivery(message)
            started, delivery.started = delivery.started, None
            if outcome.kind != OutcomeKind.SENT:
                delivery.failed_attempt = attempt
        if started is not None:
            ORDER_BROKER_LATENCY.observe((time.perf_counter() - started) * 1000)
        if outcome.kind != OutcomeKind.SENT:
            return outcome
        try:
            answer = json.loads(body) if body else {}
        except ValueError:
            answer = {}
        result = exec_result(answer, message.event_id)
        with self._lock:
            self._delivery(message).result = result
        return Outcome.sent(ref=result["broker_order_id"] or outcome.ref, code=outcome.code)

    def _paper(self, message: ClaimedMessage) -> Outcome:
        result = exec_result(
            {
                "broker_order_id": "paper-" + hashlib.sha256(message.event_id.encode()).hexdigest()[:16],
                "accepted_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "status": "accepted",
            },
            message.event_id,
        )
        with self._lock:
            self._delivery(message).result = result
        return Outcome.sent(ref=result["broker_order_id"])

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if self.http is None:
            return [self._paper(m) for m in messages]
        return self.http.deliver(messages)

    def after_settle(self, conn: psycopg.Connection, settled: Sequence[tuple[ClaimedMessage, "Settlement"]]) -> None:
        outcomes = []
        for message, settlement in settled:
            with self._lock:
                delivery = self._deliveries.pop(message.id, None) or _Delivery()
            outcome = settled_order(message, settlement, delivery)
            if outcome is not None:
                outcomes.append(outcome)
        record_outcomes(conn, outcomes)

    def close(self) -> None:
        if self.http is not None:
            self.http.close()


def _client_key(message: ClaimedMessage) -> str | None:
    """The caller's own idempotency key: the stored order carries it (the event id is the broker's, caller-scoped)."""
    key = message.payload.get("idempotency_key") if isinstance(message.payload, dict) else None
    return key if isinstance(key, str) else None


def settled_order(message: ClaimedMessage, settlement: "Settlement", delivery: _Delivery) -> SettledOrder | None:
    """The ledger's outcome of a settled message; None while it is still to be retried."""
    if settlement.status in (SettleStatus.SENT, SettleStatus.DELETED):
        # The broker saw the caller-scoped key; the caller gets its own key back.
        result = delivery.result or exec_result({}, message.event_id)
        result = {**result, "idempotency_key": _client_key(message) or result["idempotency_key"]}
        return SettledOrder(message.event_id, "succeeded", result, result_digest(result))
    if settlement.status == SettleStatus.DEAD:
        attempt = delivery.failed_attempt or Attempt()
        code, http_status = failure_code(settlement.error_code, settlement.error, attempt.status, attempt.failure)
        reason = caller_reason(code, settlement.error_code, http_status, attempt.failure, settlement.attempts)
        return SettledOrder(message.event_id, "failed", None, None, reason, code, http_status, settlement.error_code)
    return None


def build_order_broker(table: "TableSettings", settings: "Settings") -> OrderBroker:
    """The destination of a table whose settings say ``destination = "orders"`` (``wings.destinations()``)."""
    return OrderBroker(
        table.url,
        token=table.token,
        max_in_flight=table.requests_in_flight,
        transport=table.transport,
        already_processed=table.already_processed,
    )
