"""The order broker adapter (seed 000 §4): OrderRequest → broker request, ExecResult → ledger.

Every attempt carries the same Idempotency-Key; the timeout follows the
order's time in force (2.5 s IOC, 5 s FOK/GTC). After the relay settles a
batch, ``after_settle`` records each order's result in ``idempo_ledger`` in the
same transaction: succeeded with the ExecResult and its digest, or failed with
seed 001's error code (``BROKER_REJECTED`` / ``BROKER_TIMEOUT`` / ``BROKER_DOWN``),
the HTTP status of the failure and the reason (``ledger.failure_code``), from what
the last attempt saw on the wire. Without a broker URL, the paper broker executes
every order.
"""

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import psycopg

from outbox_pipelines.core.destinations.http import Attempt, HttpDestination, HttpRequest, trace_headers
from outbox_pipelines.core.ledger import SettledOrder, failure_code, record_outcomes
from outbox_pipelines.core.metrics import ORDER_BROKER_LATENCY
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.orders import broker_request, broker_timeout_s, exec_result, result_digest
from outbox_pipelines.core.redaction import redact_url
from outbox_pipelines.core.table import Settlement


class OrderBroker:
    # Deliveries wait on the network: the relay claims and settles other batches meanwhile.
    pipelined = True

    def __init__(self, url: str | None = None, *, token: str | None = None, concurrency: int = 32,
                 transport: str = "aiohttp-native") -> None:
        self._results: dict[int, dict[str, Any]] = {}
        # What the last failed attempt of each message saw (HTTP status, or why there was no answer).
        self._attempts: dict[int, Attempt] = {}
        self._started: dict[int, float] = {}
        self._lock = threading.Lock()
        self.http = (
            HttpDestination(url, name=f"order broker {redact_url(url)}", parallelism=concurrency, token=token,
                            transport=transport, build_request=self._request, on_result=self._capture)
            if url else None
        )
        self.name = self.http.name if self.http else "paper order broker"

    def _request(self, message: ClaimedMessage) -> HttpRequest:
        with self._lock:
            self._started[message.id] = time.perf_counter()
        return HttpRequest(body=broker_request(message.payload, message.event_id, message.trace_id),
                           headers=trace_headers(message), timeout_s=broker_timeout_s(message.payload))

    def _remember(self, message: ClaimedMessage, result: dict[str, Any]) -> None:
        with self._lock:
            self._results[message.id] = result

    def _capture(self, message: ClaimedMessage, outcome: Outcome, body: bytes, attempt: Attempt) -> Outcome:
        with self._lock:
            started = self._started.pop(message.id, None)
            if outcome.kind != "sent":
                self._attempts[message.id] = attempt
        if started is not None:
            ORDER_BROKER_LATENCY.observe((time.perf_counter() - started) * 1000)
        if outcome.kind != "sent":
            return outcome
        try:
            answer = json.loads(body) if body else {}
        except ValueError:
            answer = {}
        result = exec_result(answer, message.event_id)
        self._remember(message, result)
        return Outcome.sent(ref=result["broker_order_id"] or outcome.ref, code=outcome.code)

    def _paper(self, message: ClaimedMessage) -> Outcome:
        result = exec_result({
            "broker_order_id": "paper-" + hashlib.sha256(message.event_id.encode()).hexdigest()[:16],
            "accepted_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "status": "accepted",
        }, message.event_id)
        self._remember(message, result)
        return Outcome.sent(ref=result["broker_order_id"])

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if self.http is None:
            return [self._paper(m) for m in messages]
        return self.http.deliver(messages)

    def after_settle(self, conn: psycopg.Connection, settled: Sequence[tuple[ClaimedMessage, Settlement]]) -> None:
        rows = []
        for message, settlement in settled:
            with self._lock:
                result = self._results.pop(message.id, None)
                attempt = self._attempts.pop(message.id, None)
            scope, key = message.headers.get("ledger_scope"), message.headers.get("ledger_key")
            if key is None or scope is None:
                continue  # not an Order API order: no ledger row
            if settlement.status in ("sent", "deleted"):
                # The broker saw the caller-scoped key; the caller gets its own key back.
                result = {**(result or exec_result({}, message.event_id)), "idempotency_key": key}
                rows.append(SettledOrder(scope, key, "succeeded", result, result_digest(result), None, None, 200))
            elif settlement.status == "dead":
                attempt = attempt or Attempt()
                code, http_status = failure_code(settlement.error_code, settlement.error, attempt.status, attempt.failure)
                reason = f"{code}: {settlement.error_code}: {settlement.error or ''}"[:2000]
                rows.append(SettledOrder(scope, key, "failed", None, None, reason, code, http_status,
                                         settlement.error_code))
        record_outcomes(conn, rows)

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
