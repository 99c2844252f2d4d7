"""The Order API: POST /do/order, GET /do/order/{key}, /healthz, /metrics, /openapi.json.

Order of checks (nothing is stored for a rejected request): bearer token (401),
rate limit per client (429), content type (415), body size (413), JSON (400),
header/body key (422 IDEMPOTENCY_MISMATCH), OrderRequest v1.1 (422
VALIDATION_ERROR, every violation), then the ledger row and the outbox row in
one transaction: 201 first time, 200 identical repeat, 409 different body.

A database that is busy (a lock, a full pool: past OUTBOX_API_DB_TIMEOUT, 2 s)
answers 503 DATABASE_BUSY, one that cannot be reached 503 DATABASE_UNAVAILABLE,
both with Retry-After and nothing stored; /healthz answers within 1 s on a
connection of its own (see dbguard).
"""

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox_pipelines.api.dbguard import Budget, DatabaseTrouble, GuardedEngine, HealthProbe, with_session_timeouts
from outbox_pipelines.api.openapi import document
from outbox_pipelines.api.ratelimit import RateLimiter
from outbox_pipelines.core import metrics
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.ledger import Acceptance, KeyReused, accept_order, ledger_entry
from outbox_pipelines.core.orders import KEY_PATTERN, validate_order
from outbox_pipelines.core.settings import parse_duration

log = logging.getLogger("outbox_pipelines.api")

ORDER_DATABASE_REJECTIONS = Counter(
    "order_database_rejections_total", "Order API requests answered 503 because of the database, by reason",
    ["code", "reason"], registry=metrics.REGISTRY,
)


@dataclass
class ApiSettings:
    database_url: str
    tokens: tuple[str, ...] = ()
    rate_per_minute: int = 60
    max_body_bytes: int = 16 * 1024
    trusted_proxies: tuple[str, ...] = ()
    watch_tables: Sequence[str] = field(default_factory=lambda: ("outbox_orders",))
    # A request's database work (pool wait + transaction) is bounded by db_timeout_s: past it,
    # 503 DATABASE_BUSY with Retry-After. The pool waits at most pool_timeout_s of it.
    db_timeout_s: float = 2.0
    pool_size: int = 8
    pool_max_overflow: int = 8
    pool_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.db_timeout_s > 0 or not self.pool_timeout_s > 0:
            raise ConfigError("OUTBOX_API_DB_TIMEOUT and OUTBOX_API_POOL_TIMEOUT must be over 0 (e.g. 2s, 500ms)")
        if self.pool_size < 1 or self.pool_max_overflow < 0:
            raise ConfigError("OUTBOX_API_POOL_SIZE must be at least 1 and OUTBOX_API_POOL_MAX_OVERFLOW at least 0")

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.db_timeout_s))

    @classmethod
    def from_env(cls, database_url: str) -> "ApiSettings":
        tokens = tuple(t.strip() for t in (os.environ.get("OUTBOX_API_TOKEN") or "").split(",") if t.strip())
        proxies = tuple(p.strip() for p in (os.environ.get("OUTBOX_TRUSTED_PROXIES") or "").split(",") if p.strip())
        return cls(
            database_url=database_url,
            tokens=tokens,
            rate_per_minute=int(os.environ.get("OUTBOX_API_RATE_PER_MINUTE", "60")),
            max_body_bytes=int(os.environ.get("OUTBOX_API_MAX_BODY_BYTES", str(16 * 1024))),
            trusted_proxies=proxies,
            db_timeout_s=parse_duration(os.environ.get("OUTBOX_API_DB_TIMEOUT") or "2s", "OUTBOX_API_DB_TIMEOUT"),
            pool_size=_env_int("OUTBOX_API_POOL_SIZE", 8),
            pool_max_overflow=_env_int("OUTBOX_API_POOL_MAX_OVERFLOW", 8),
            pool_timeout_s=parse_duration(os.environ.get("OUTBOX_API_POOL_TIMEOUT") or "2s", "OUTBOX_API_POOL_TIMEOUT"),
        )


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name) or str(default)
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


class Rejection(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None,
                 reason: str = "", **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers or {}, extra
        self.reason = reason  # for the log line only, never in the body

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "message": self.message, **self.extra}, self.status, headers=self.headers)


def _scope_of(token: str) -> str:
    return "t:" + hashlib.sha256(token.encode()).hexdigest()[:16]


class OrderApi:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.limiter = RateLimiter(settings.rate_per_minute)
        self.db = GuardedEngine(settings.database_url, pool_size=settings.pool_size,
                                max_overflow=settings.pool_max_overflow, pool_timeout_s=settings.pool_timeout_s,
                                timeout_s=settings.db_timeout_s)
        self.engine = self.db.engine
        self.health_probe = HealthProbe(settings.database_url)
        self._proxies = [ipaddress.ip_network(p, strict=False) for p in settings.trusted_proxies]
        # This app's own table gauges: metrics.watch_tables registers one collector per process
        # (the first database wins), which would report another app's database here.
        self.state_metrics = CollectorRegistry(auto_describe=False)
        # A scrape while a table is locked gives up after the API's timeout (the gauges are left out)
        # instead of hanging on the lock.
        scrape_url = with_session_timeouts(settings.database_url, int(settings.db_timeout_s * 1000))
        self.state_metrics.register(metrics.OutboxStateCollector(scrape_url, settings.watch_tables))

    def database_rejection(self, trouble: DatabaseTrouble, what: str) -> Rejection:
        """503 for a busy or unreachable database: Retry-After, and a retry with the same key is safe."""
        ORDER_DATABASE_REJECTIONS.labels(trouble.code, trouble.reason).inc()
        wait = self.settings.retry_after_s
        if trouble.busy:
            message = (f"the outbox database is busy ({trouble.reason.replace('_', ' ')}): nothing was stored; "
                       f"{what} after Retry-After seconds")
        else:
            message = f"the outbox database cannot be reached; {what} after Retry-After seconds"
        return Rejection(503, trouble.code, message, headers={"Retry-After": str(wait)}, reason=trouble.reason,
                         retry_after=wait)

    # -- who is calling --------------------------------------------------------
    def caller_scope(self, request: Request) -> str:
        """'' when the API is open; otherwise the scope of the bearer token (401 if none matches)."""
        if not self.settings.tokens:
            return ""
        header = request.headers.get("authorization", "")
        presented = header[7:].strip() if header.lower().startswith("bearer ") else ""
        matched = ""
        for token in self.settings.tokens:  # compare with every token: no early exit to time
            if hmac.compare_digest(presented.encode(), token.encode()) and presented:
                matched = token
        if not matched:
            raise Rejection(401, "UNAUTHORIZED", "send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})
        return _scope_of(matched)

    def client_id(self, request: Request, scope: str) -> str:
        """The rate-limit identity: the token's scope, else the peer address.

        X-Forwarded-For is believed only from a trusted proxy (OUTBOX_TRUSTED_PROXIES),
        so a client cannot dodge the limit by inventing addresses.
        """
        if scope:
            return scope
        peer = request.client.host if request.client else "unknown"
        forwarded = request.headers.get("x-forwarded-for")
        if forwarded and self._proxies:
            try:
                peer_ip = ipaddress.ip_address(peer)
                if any(peer_ip in net for net in self._proxies):
                    return forwarded.split(",")[-1].strip() or peer
            except ValueError:
                pass
        return peer

    def rate_limit(self, client: str) -> None:
        wait = self.limiter.allow(client)
        if wait:
            raise Rejection(429, "RATE_LIMITED", f"over {self.settings.rate_per_minute} requests per minute",
                            headers={"Retry-After": str(wait)}, retry_after=wait)

    # -- the body --------------------------------------------------------------
    async def read_json(self, request: Request) -> Any:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise Rejection(415, "UNSUPPORTED_MEDIA_TYPE", "send the order as Content-Type: application/json")
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise Rejection(413, "PAYLOAD_TOO_LARGE", f"the body is over {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise Rejection(413, "PAYLOAD_TOO_LARGE", f"the body is over {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            value = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
            # An escaped lone surrogate ("\ud800") parses, but is not Unicode text: it can be
            # neither digested nor stored, so it is malformed input, not a server error.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (UnicodeError, ValueError, RecursionError):
            raise Rejection(400, "MALFORMED_JSON", "the body is not valid UTF-8 JSON") from None
        return value

    # -- endpoints -------------------------------------------------------------
    async def submit(self, request: Request) -> Response:
        scope = self.caller_scope(request)
        self.rate_limit(self.client_id(request, scope))
        body = await self.read_json(request)
        header_key = request.headers.get("idempotency-key")
        body_key = body.get("idempotency_key") if isinstance(body, dict) else None
        if not header_key:
            raise Rejection(422, "IDEMPOTENCY_MISMATCH", "the Idempotency-Key header is required and must equal body.idempotency_key")
        if header_key != body_key:
            raise Rejection(422, "IDEMPOTENCY_MISMATCH", "the Idempotency-Key header must equal body.idempotency_key")
        violations = validate_order(body)
        if violations:
            raise Rejection(422, "VALIDATION_ERROR", f"{len(violations)} problem(s) with the order",
                            violations=[v.as_dict() for v in violations])
        trace_id = request.headers.get("x-trace-id") or f"do-{uuid.uuid4().hex[:16]}"
        budget = self.db.budget()  # counted from here: waiting for a worker thread takes from it too
        acceptance = await run_in_threadpool(self._accept, scope, body, trace_id, budget)
        if acceptance.kind == "conflict":
            metrics.ORDER_CONFLICTS.inc()
        log.info("order key=%s status=%s kind=%s trace_id=%s", header_key, acceptance.http_status, acceptance.kind, trace_id)
        return JSONResponse(acceptance.body, acceptance.http_status, headers={"X-Trace-Id": trace_id})

    def _accept(self, scope: str, body: dict[str, Any], trace_id: str, budget: Budget) -> Any:
        try:
            with self.db.transaction(budget) as conn:
                return accept_order(conn, scope, body, trace_id=trace_id)
        except KeyReused as reused:  # the transaction rolled back: nothing stored
            return Acceptance("conflict", 409, reused.body)
        except DatabaseTrouble as trouble:  # the transaction rolled back (or never began)
            raise self.database_rejection(trouble, "retry with the same key (the same Idempotency-Key and body)") from None

    async def status(self, request: Request) -> Response:
        scope = self.caller_scope(request)
        self.rate_limit(self.client_id(request, scope))
        key = request.path_params["key"]
        if not KEY_PATTERN.fullmatch(key):
            raise Rejection(404, "NOT_FOUND", "no order with this key")
        entry = await run_in_threadpool(self._entry, scope, key, self.db.budget())
        if entry is None:
            raise Rejection(404, "NOT_FOUND", "no order with this key")
        return JSONResponse({
            "idempotency_key": entry["idempotency_key"],
            "status": entry["status"],
            "http_status": entry["http_status"],
            "request_digest": entry["request_digest"],
            "accepted_at": entry["created_at"].isoformat(),
            "updated_at": entry["updated_at"].isoformat(),
            "expires_at": entry["expires_at"].isoformat(),
            "result": entry["result"],
            "result_digest": entry["result_digest"],
            "reason": entry["reason"],
        })

    def _entry(self, scope: str, key: str, budget: Budget) -> dict[str, Any] | None:
        try:
            with self.db.transaction(budget) as conn:
                return ledger_entry(conn, scope, key)
        except DatabaseTrouble as trouble:
            raise self.database_rejection(trouble, "ask again") from None

    async def health(self, request: Request) -> Response:
        """Within 1 s whatever the request pool is doing: a probe on a connection of its own."""
        health = await self.health_probe.check()
        if health.ok:
            return JSONResponse({"status": "ok"})
        message = ("the outbox database did not answer within 1 s" if health.database == "timeout"
                   else "the outbox database cannot be reached")
        wait = self.settings.retry_after_s
        degraded = Rejection(503, "DATABASE_UNAVAILABLE", message, headers={"Retry-After": str(wait)},
                             reason=f"healthz_{health.database}", retry_after=wait)
        degraded.extra.update(status="degraded", database=health.database)
        raise degraded

    async def metrics_endpoint(self, request: Request) -> Response:
        payload = await run_in_threadpool(lambda: metrics.exposition() + generate_latest(self.state_metrics))
        return Response(payload, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(document(self.settings.rate_per_minute, self.settings.max_body_bytes))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def create_app(settings: ApiSettings) -> Starlette:
    api = OrderApi(settings)

    def endpoint(handler: Any) -> Any:
        async def wrapped(request: Request) -> Response:
            started = time.perf_counter()
            rejection: Rejection | None = None
            try:
                response = await handler(request)
            except Rejection as rejected:
                rejection, response = rejected, rejected.response()
            except Exception:
                log.exception("unexpected error on %s %s", request.method, request.url.path)
                response = JSONResponse({"error": "INTERNAL_ERROR", "message": "unexpected error; retry with the same key"}, 500)
            elapsed_ms = (time.perf_counter() - started) * 1000
            if request.url.path.startswith("/do/order"):
                metrics.ORDER_REQUESTS.labels(str(response.status_code)).inc()
            if response.status_code == 503:  # once per request, the reason only: no body, no URL
                reason = rejection.reason if rejection is not None else ""
                log.warning("%s %s -> 503 %s (%s) in %.1f ms", request.method, request.url.path[:64],
                            rejection.code if rejection is not None else "", reason, elapsed_ms)
            elif request.url.path.startswith("/do/order"):
                log.info("%s %s -> %s in %.1f ms", request.method, request.url.path[:64], response.status_code, elapsed_ms)
            return response

        return wrapped

    routes = [
        Route("/do/order", endpoint(api.submit), methods=["POST"]),
        Route("/do/order/{key}", endpoint(api.status), methods=["GET"]),
        Route("/healthz", endpoint(api.health), methods=["GET"]),
        Route("/metrics", endpoint(api.metrics_endpoint), methods=["GET"]),
        Route("/openapi.json", endpoint(api.openapi), methods=["GET"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        api.db.dispose()
        api.health_probe.dispose()

    async def http_error(request: Request, exc: Exception) -> Response:
        # Routing errors (no such path, wrong method) answer in the same JSON shape as every other error.
        assert isinstance(exc, HTTPException)
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        return JSONResponse({"error": code, "message": exc.detail}, exc.status_code, headers=exc.headers)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.api = api
    return app
