"""The Order API: POST /do/order, GET /do/order/{key}, /healthz, /metrics, /openapi.json.

Order of checks (nothing is stored for a rejected request): failed
authentications from this address (429, before the token costs anything), bearer
token (401), rate limit per client (429), content type (415), body size (413), JSON (400),
header/body key (422 IDEMPOTENCY_MISMATCH), OrderRequest v1.1 (422
VALIDATION_ERROR, every violation), then the ledger row and the outbox row in
one transaction: 201 first time, 200 identical repeat, 409 different body.

A database that is busy (a lock, a full pool: past OUTBOX_API_DB_TIMEOUT, 2 s)
answers 503 DATABASE_BUSY, one that cannot be reached 503 DATABASE_UNAVAILABLE,
both with Retry-After and nothing stored; /healthz answers within 1 s on a
connection of its own (see dbguard).

Every request to /do/order (and every failed one elsewhere) gives exactly one log
line on ``outbox_pipelines.orders.api``: method, route, status, reason_code (the error
code, OK for success), trace_id, idempotency_key, latency_ms — the same fields as
``extra`` for structured handlers — and nothing from the body. A client that goes
away mid-request is status 499 (nginx's convention) at INFO, never a 500.
POST /do/order runs in a ``do.order`` span (see tracing).
"""

import contextlib
import ipaddress
import json
import logging
import math
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.oncall import metrics
from outbox_pipelines.core.settings import env_bool, env_int, parse_duration
from outbox_pipelines.orders import ORDERS_TABLE
from outbox_pipelines.orders import metrics as order_metrics
from outbox_pipelines.orders.api import tracing
from outbox_pipelines.orders.api.auth import Tokens, read_or_create_secret, validate_secret
from outbox_pipelines.orders.api.dbguard import (
    Budget,
    DatabaseTrouble,
    GuardedEngine,
    HealthProbe,
    with_session_timeouts,
)
from outbox_pipelines.orders.api.openapi import document
from outbox_pipelines.orders.api.ratelimit import FailureLimiter, RateLimiter
from outbox_pipelines.orders.ledger import Acceptance, KeyReused, accept_order, ledger_entry
from outbox_pipelines.orders.validation import KEY_PATTERN, validate_order

log = logging.getLogger("outbox_pipelines.orders.api")

ORDER_DATABASE_REJECTIONS = Counter(
    "order_database_rejections_total", "Order API requests answered 503 because of the database, by reason",
    ["code", "reason"], registry=metrics.REGISTRY,
)


TRACE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
CLIENT_CLOSED = 499  # nginx's "client closed request": never sent, only logged and counted
# What POST /do/order answers for what the ledger made of an order (seed 001): the stored answer with
# 201 the first time, with 200 for an identical repeat; 409 IDEMPOTENCY_CONFLICT otherwise.
ACCEPTANCE_STATUS = {"accepted": 201, "replay": 200}
CONFLICT_STATUS = 409
DIFFERENT_BODY = "body differs from the first request with this key"
KEY_REUSED = "this key was used for an earlier order (past the 48 h ledger window); use a new key"


@dataclass
class ApiSettings:
    database_url: str = field(repr=False)
    # The bearer tokens the API accepts (OUTBOX_API_TOKEN); only ever compared, never sent anywhere.
    tokens: tuple[str, ...] = field(default=(), repr=False)
    rate_per_minute: int = 60
    max_body_bytes: int = 16 * 1024
    trusted_proxies: tuple[str, ...] = ()
    watch_tables: Sequence[str] = field(default_factory=lambda: (ORDERS_TABLE,))
    # A request's database work (pool wait + transaction) is bounded by db_timeout_s: past it,
    # 503 DATABASE_BUSY with Retry-After. The pool waits at most pool_timeout_s of it.
    db_timeout_s: float = 2.0
    pool_size: int = 8
    pool_max_overflow: int = 8
    pool_timeout_s: float = 2.0
    # The key of the per-caller scope HMAC (OUTBOX_API_SCOPE_SECRET); None: one random secret per
    # database, in outbox_api_secret.
    scope_secret: str | None = field(default=None, repr=False)
    # Failed authentications per client address and minute before 429 (OUTBOX_API_AUTH_FAILURES_PER_MINUTE).
    auth_failures_per_minute: int = 10
    # /metrics needs the bearer token (OUTBOX_API_METRICS_REQUIRE_TOKEN); None: when tokens are set.
    metrics_require_token: bool | None = None

    def __post_init__(self) -> None:
        self.scope_secret = validate_secret(self.scope_secret)
        if self.auth_failures_per_minute < 1:
            raise ConfigError("OUTBOX_API_AUTH_FAILURES_PER_MINUTE must be at least 1")
        if self.metrics_require_token and not self.tokens:
            raise ConfigError("OUTBOX_API_METRICS_REQUIRE_TOKEN=true needs OUTBOX_API_TOKEN "
                              "(the tokens /metrics accepts)")
        if not self.db_timeout_s > 0 or not self.pool_timeout_s > 0:
            raise ConfigError("OUTBOX_API_DB_TIMEOUT and OUTBOX_API_POOL_TIMEOUT must be over 0 (e.g. 2s, 500ms)")
        if self.pool_size < 1 or self.pool_max_overflow < 0:
            raise ConfigError("OUTBOX_API_POOL_SIZE must be at least 1 and OUTBOX_API_POOL_MAX_OVERFLOW at least 0")

    @property
    def metrics_protected(self) -> bool:
        return bool(self.tokens) if self.metrics_require_token is None else self.metrics_require_token

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
            rate_per_minute=env_int(os.environ, "OUTBOX_API_RATE_PER_MINUTE", 60),
            max_body_bytes=env_int(os.environ, "OUTBOX_API_MAX_BODY_BYTES", 16 * 1024),
            trusted_proxies=proxies,
            db_timeout_s=parse_duration(os.environ.get("OUTBOX_API_DB_TIMEOUT") or "2s", "OUTBOX_API_DB_TIMEOUT"),
            pool_size=env_int(os.environ, "OUTBOX_API_POOL_SIZE", 8, minimum=0),
            pool_max_overflow=env_int(os.environ, "OUTBOX_API_POOL_MAX_OVERFLOW", 8, minimum=0),
            pool_timeout_s=parse_duration(os.environ.get("OUTBOX_API_POOL_TIMEOUT") or "2s", "OUTBOX_API_POOL_TIMEOUT"),
            scope_secret=os.environ.get("OUTBOX_API_SCOPE_SECRET") or None,
            auth_failures_per_minute=env_int(os.environ, "OUTBOX_API_AUTH_FAILURES_PER_MINUTE", 10, minimum=0),
            metrics_require_token=env_bool(os.environ, "OUTBOX_API_METRICS_REQUIRE_TOKEN", None),
        )


@dataclass
class RequestFacts:
    """What the one log line (and the span) of a request says; filled in as the request goes."""

    route: str
    trace_id: str = ""
    idempotency_key: str = ""
    traceparent: str | None = None


class Rejection(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None,
                 reason: str = "", **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers or {}, extra
        self.reason = reason  # for the log line only, never in the body

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "message": self.message, **self.extra}, self.status,
                            headers=self.headers)


class OrderApi:
    def __init__(self, settings: ApiSettings, tracer_provider: "trace.TracerProvider | None" = None) -> None:
        self.settings = settings
        self.tokens = Tokens(settings.tokens, settings.scope_secret)
        self.limiter = RateLimiter(settings.rate_per_minute)
        self.auth_failures = FailureLimiter(settings.auth_failures_per_minute)
        self.tracer = tracing.tracer(tracer_provider)
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
    def authenticate(self, request: Request) -> int | None:
        """None when the API is open; else the index of the caller's token.

        An address with too many failed attempts gets 429 before its token is even
        looked at (right or wrong); a wrong or missing token is 401 and one more failure."""
        if not self.tokens:
            return None
        address = self.client_address(request)
        wait = self.auth_failures.blocked(address)
        if wait:
            raise Rejection(429, "RATE_LIMITED", f"too many failed authentications from this address (over "
                            f"{self.settings.auth_failures_per_minute} per minute); retry after Retry-After seconds",
                            headers={"Retry-After": str(wait)}, reason="auth_failures", retry_after=wait)
        index = self.tokens.match(request.headers.get("authorization", ""))
        if index is None:
            self.auth_failures.failed(address)
            raise Rejection(401, "UNAUTHORIZED", "send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})
        return index

    def client_address(self, request: Request) -> str:
        """The peer address; X-Forwarded-For is believed only from a trusted proxy (OUTBOX_TRUSTED_PROXIES),
        so a client cannot dodge a limit by inventing addresses."""
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

    def client_id(self, request: Request, token_index: int | None) -> str:
        """The rate-limit identity: the caller's token, else its address."""
        return f"token#{token_index}" if token_index is not None else self.client_address(request)

    def _ensure_scopes(self, budget: Budget) -> None:
        """The per-caller scopes need the server secret: read (or created) once, in a transaction of its own."""
        if self.tokens.ready:
            return
        with self.db.transaction(budget) as conn:
            secret = read_or_create_secret(conn)
        self.tokens.install(secret)

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
        facts: RequestFacts = request.state.facts
        header_key = request.headers.get("idempotency-key")
        if header_key and KEY_PATTERN.fullmatch(header_key):
            facts.idempotency_key = header_key  # logged for rejections too; a malformed one never is
        caller = self.authenticate(request)
        self.rate_limit(self.client_id(request, caller))
        body = await self.read_json(request)
        body_key = body.get("idempotency_key") if isinstance(body, dict) else None
        if not header_key:
            raise Rejection(422, "IDEMPOTENCY_MISMATCH",
                            "the Idempotency-Key header is required and must equal body.idempotency_key")
        if header_key != body_key:
            raise Rejection(422, "IDEMPOTENCY_MISMATCH", "the Idempotency-Key header must equal body.idempotency_key")
        violations = validate_order(body)
        if violations:
            raise Rejection(422, "VALIDATION_ERROR", f"{len(violations)} problem(s) with the order",
                            violations=[v.as_dict() for v in violations])
        budget = self.db.budget()  # counted from here: waiting for a worker thread takes from it too
        acceptance = await run_in_threadpool(self._accept, caller, body, facts.trace_id, facts.traceparent, budget)
        return JSONResponse(acceptance.response, ACCEPTANCE_STATUS[acceptance.kind])

    def _accept(self, caller: int | None, body: dict[str, Any], trace_id: str, traceparent: str | None,
                budget: Budget) -> Acceptance:
        """The ledger's acceptance of the order; a conflict is raised as its 409."""
        key = body["idempotency_key"]
        try:
            self._ensure_scopes(budget)
            with self.db.transaction(budget) as conn:
                scope = self.tokens.effective_scope(conn, caller, key)
                acceptance = accept_order(conn, scope, body, trace_id=trace_id, traceparent=traceparent)
        except KeyReused:  # the transaction rolled back: nothing stored
            raise conflict(key, KEY_REUSED) from None
        except DatabaseTrouble as trouble:  # the transaction rolled back (or never began)
            raise self.database_rejection(
                trouble, "retry with the same key (the same Idempotency-Key and body)") from None
        if acceptance.kind == "conflict":
            raise conflict(key, DIFFERENT_BODY)
        return acceptance

    async def status(self, request: Request) -> Response:
        facts: RequestFacts = request.state.facts
        key = request.path_params["key"]
        if KEY_PATTERN.fullmatch(key):
            facts.idempotency_key = key
        caller = self.authenticate(request)
        self.rate_limit(self.client_id(request, caller))
        if not KEY_PATTERN.fullmatch(key):
            raise Rejection(404, "NOT_FOUND", "no order with this key")
        entry = await run_in_threadpool(self._entry, caller, key, self.db.budget())
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

    def _entry(self, caller: int | None, key: str, budget: Budget) -> dict[str, Any] | None:
        try:
            self._ensure_scopes(budget)
            with self.db.transaction(budget) as conn:
                return ledger_entry(conn, self.tokens.effective_scope(conn, caller, key), key)
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
        if self.settings.metrics_protected:
            self.authenticate(request)
        payload = await run_in_threadpool(lambda: metrics.exposition() + generate_latest(self.state_metrics))
        return Response(payload, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(document(self.settings.rate_per_minute, self.settings.max_body_bytes,
                                     self.settings.auth_failures_per_minute))


def conflict(key: str, message: str) -> Rejection:
    """409 IDEMPOTENCY_CONFLICT for ``key`` (counted): nothing was stored."""
    order_metrics.ORDER_CONFLICTS.inc()
    return Rejection(CONFLICT_STATUS, "IDEMPOTENCY_CONFLICT", message, idempotency_key=key)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


ORDER_ROUTES = ("/do/order", "/do/order/{key}")


def _request_trace_id(request: Request, span: trace.Span | None) -> str:
    """The client's X-Trace-Id when it is a plain token, else the span's trace id, else a fresh one."""
    sent = request.headers.get("x-trace-id")
    if sent and TRACE_ID_PATTERN.fullmatch(sent):
        return sent
    return (tracing.trace_id_hex(span) if span is not None else None) or f"do-{uuid.uuid4().hex[:16]}"


def log_request(method: str, route: str, status: int, reason_code: str, facts: RequestFacts | None,
                elapsed_ms: float, *, reason: str = "", exc_info: Any = None) -> None:
    """The one line of a request: its route (never the raw path), status, code and timing; no body, no token."""
    trace_id = facts.trace_id if facts else ""
    key = facts.idempotency_key if facts else ""
    fields = {"http_method": method, "route": route, "status": status, "reason_code": reason_code,
              "trace_id": trace_id, "idempotency_key": key, "latency_ms": round(elapsed_ms, 1), "reason": reason}
    level = logging.ERROR if status >= 500 and status != 503 else logging.WARNING if status == 503 else logging.INFO
    message = ("%s %s status=%s reason_code=%s trace_id=%s idempotency_key=%s latency_ms=%.1f"
               + (" reason=%s" if reason else ""))
    args: tuple[Any, ...] = (method, route, status, reason_code, trace_id or "-", key or "-", elapsed_ms)
    log.log(level, message, *(args + ((reason,) if reason else ())), extra=fields, exc_info=exc_info)


def _server_span(api: OrderApi, span_name: str | None, request: Request) -> Any:
    """The request's server span (continuing the caller's trace), or no span for a route without one."""
    if not span_name:
        return contextlib.nullcontext(None)
    return api.tracer.start_as_current_span(span_name, context=tracing.incoming_context(request.headers),
                                            kind=trace.SpanKind.SERVER, record_exception=False,
                                            set_status_on_exception=False)


async def _answer(handler: Any, request: Request) -> tuple[Response, str, Rejection | None, Any]:
    """The handler's response and reason code, the rejection it raised, and a bug's exc_info: every
    outcome of a request is an answer."""
    try:
        response: Response = await handler(request)
        return response, "OK", None, None
    except Rejection as rejected:
        return rejected.response(), rejected.code, rejected, None
    except ClientDisconnect:
        # The client went away mid-body: nothing was read whole, nothing stored, nobody to answer.
        return Response(status_code=CLIENT_CLOSED), "CLIENT_DISCONNECTED", None, None
    except Exception:  # noqa: BLE001 - any bug is a 500 with its one log line (and traceback)
        exc_info = sys.exc_info()
        response = JSONResponse({"error": "INTERNAL_ERROR", "message": "unexpected error; retry with the same key"},
                                500)
        return response, "INTERNAL_ERROR", None, exc_info


def _describe_span(span: trace.Span, method: str, route: str, status: int, reason_code: str,
                   facts: RequestFacts) -> None:
    span.set_attribute("http.request.method", method)
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("order.reason_code", reason_code)
    span.set_attribute("order.trace_id", facts.trace_id)
    if facts.idempotency_key:
        span.set_attribute("order.idempotency_key", facts.idempotency_key)
    if status >= 500 and status != CLIENT_CLOSED:
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason_code))


def _endpoint(api: OrderApi, handler: Any, route: str, span_name: str | None = None) -> Any:
    """``handler`` as a route: its trace id and span, the order routes' metric, one log line."""
    order_route = route in ORDER_ROUTES

    async def wrapped(request: Request) -> Response:
        started = time.perf_counter()
        facts = RequestFacts(route=route)
        request.state.facts = facts
        with _server_span(api, span_name, request) as span:
            if span is not None:
                facts.traceparent = tracing.traceparent(span)
            facts.trace_id = _request_trace_id(request, span)
            response, reason_code, rejection, exc_info = await _answer(handler, request)
            status = response.status_code
            if span is not None:
                _describe_span(span, request.method, route, status, reason_code, facts)
        if order_route:
            response.headers["X-Trace-Id"] = facts.trace_id
            order_metrics.ORDER_REQUESTS.labels(str(status)).inc()
        if order_route or status >= 400:  # healthz, metrics and openapi: only their failures
            log_request(request.method, route, status, reason_code, facts, (time.perf_counter() - started) * 1000,
                        reason=rejection.reason if rejection is not None else "", exc_info=exc_info)
        return response

    return wrapped


async def _http_error(request: Request, exc: Exception) -> Response:
    """Routing errors (no such path, wrong method) answer in the same JSON shape as every other error,
    and get their one log line (the route is unknown: the raw path is not logged)."""
    assert isinstance(exc, HTTPException)
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
    log_request(request.method, "-", exc.status_code, code, None, 0.0)
    return JSONResponse({"error": code, "message": exc.detail}, exc.status_code, headers=exc.headers)


def create_app(settings: ApiSettings, *, tracer_provider: "trace.TracerProvider | None" = None) -> Starlette:
    """The Order API; spans go to ``tracer_provider`` (default: the global one, a no-op unless configured)."""
    api = OrderApi(settings, tracer_provider)
    routes = [
        Route("/do/order", _endpoint(api, api.submit, "/do/order", "do.order"), methods=["POST"]),
        Route("/do/order/{key}", _endpoint(api, api.status, "/do/order/{key}"), methods=["GET"]),
        Route("/healthz", _endpoint(api, api.health, "/healthz"), methods=["GET"]),
        Route("/metrics", _endpoint(api, api.metrics_endpoint, "/metrics"), methods=["GET"]),
        Route("/openapi.json", _endpoint(api, api.openapi, "/openapi.json"), methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        api.db.dispose()
        api.health_probe.dispose()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error})
    app.state.api = api
    return app
