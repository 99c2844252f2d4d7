"""The Order API: POST /do/order, GET /do/order/{key}, /healthz, /metrics, /openapi.json.

Order of checks (nothing is stored for a rejected request): bearer token (401),
rate limit per client (429), content type (415), body size (413), JSON (400),
header/body key (422 IDEMPOTENCY_MISMATCH), OrderRequest v1.1 (422
VALIDATION_ERROR, every violation), then the ledger row and the outbox row in
one transaction: 201 first time, 200 identical repeat, 409 different body.
"""

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox_pipelines.api.openapi import document
from outbox_pipelines.api.ratelimit import RateLimiter
from outbox_pipelines.core import db, metrics
from outbox_pipelines.core.ledger import Acceptance, KeyReused, accept_order, ledger_entry
from outbox_pipelines.core.orders import KEY_PATTERN, validate_order
from outbox_pipelines.core.store import driver_connection

log = logging.getLogger("outbox_pipelines.api")


@dataclass
class ApiSettings:
    database_url: str
    tokens: tuple[str, ...] = ()
    rate_per_minute: int = 60
    max_body_bytes: int = 16 * 1024
    trusted_proxies: tuple[str, ...] = ()
    watch_tables: Sequence[str] = field(default_factory=lambda: ("outbox_orders",))

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
        )


class Rejection(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers or {}, extra

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "message": self.message, **self.extra}, self.status, headers=self.headers)


def _scope_of(token: str) -> str:
    return "t:" + hashlib.sha256(token.encode()).hexdigest()[:16]


class OrderApi:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.limiter = RateLimiter(settings.rate_per_minute)
        self.engine = sa.create_engine(db.sqlalchemy_url(settings.database_url), pool_size=8, max_overflow=8,
                                       pool_pre_ping=True)
        self._proxies = [ipaddress.ip_network(p, strict=False) for p in settings.trusted_proxies]
        # This app's own table gauges: metrics.watch_tables registers one collector per process
        # (the first database wins), which would report another app's database here.
        self.state_metrics = CollectorRegistry(auto_describe=False)
        self.state_metrics.register(metrics.OutboxStateCollector(settings.database_url, settings.watch_tables))

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
        acceptance = await run_in_threadpool(self._accept, scope, body, trace_id)
        if acceptance.kind == "conflict":
            metrics.ORDER_CONFLICTS.inc()
        log.info("order key=%s status=%s kind=%s trace_id=%s", header_key, acceptance.http_status, acceptance.kind, trace_id)
        return JSONResponse(acceptance.body, acceptance.http_status, headers={"X-Trace-Id": trace_id})

    def _accept(self, scope: str, body: dict[str, Any], trace_id: str) -> Any:
        try:
            with self.engine.begin() as conn:
                return accept_order(driver_connection(conn), scope, body, trace_id=trace_id)
        except KeyReused as reused:  # the transaction rolled back: nothing stored
            return Acceptance("conflict", 409, reused.body)
        except (sa.exc.OperationalError, psycopg.OperationalError):
            raise Rejection(503, "DATABASE_UNAVAILABLE", "the outbox database cannot be reached; retry with the same key") from None

    async def status(self, request: Request) -> Response:
        scope = self.caller_scope(request)
        self.rate_limit(self.client_id(request, scope))
        key = request.path_params["key"]
        if not KEY_PATTERN.fullmatch(key):
            raise Rejection(404, "NOT_FOUND", "no order with this key")
        entry = await run_in_threadpool(self._entry, scope, key)
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

    def _entry(self, scope: str, key: str) -> dict[str, Any] | None:
        try:
            with self.engine.connect() as conn:
                return ledger_entry(driver_connection(conn), scope, key)
        except (sa.exc.OperationalError, psycopg.OperationalError):
            raise Rejection(503, "DATABASE_UNAVAILABLE", "the outbox database cannot be reached") from None

    async def health(self, request: Request) -> Response:
        def ping() -> None:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")

        try:
            await run_in_threadpool(ping)
        except Exception:
            return JSONResponse({"error": "DATABASE_UNAVAILABLE", "message": "the outbox database cannot be reached"}, 503)
        return JSONResponse({"status": "ok"})

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
            try:
                response = await handler(request)
            except Rejection as rejection:
                response = rejection.response()
            except Exception:
                log.exception("unexpected error on %s %s", request.method, request.url.path)
                response = JSONResponse({"error": "INTERNAL_ERROR", "message": "unexpected error; retry with the same key"}, 500)
            if request.url.path.startswith("/do/order"):
                metrics.ORDER_REQUESTS.labels(str(response.status_code)).inc()
                log.info("%s %s -> %s in %.1f ms", request.method, request.url.path[:64], response.status_code,
                         (time.perf_counter() - started) * 1000)
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
        api.engine.dispose()

    async def http_error(request: Request, exc: Exception) -> Response:
        # Routing errors (no such path, wrong method) answer in the same JSON shape as every other error.
        assert isinstance(exc, HTTPException)
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        return JSONResponse({"error": code, "message": exc.detail}, exc.status_code, headers=exc.headers)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.api = api
    return app
