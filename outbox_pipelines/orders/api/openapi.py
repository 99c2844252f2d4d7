"""The OpenAPI document of the Order API; tests fuzz the live app against it."""

from typing import Any

from outbox_pipelines.orders import ORDERS_TABLE
from outbox_pipelines.orders.validation import KEY_PATTERN, MAX_PRICE, allowed_instruments

ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "idempotency_key": {"type": "string"},
        "retry_after": {"type": "integer"},
        "violations": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}
ACK = {
    "type": "object",
    "required": ["status", "idempotency_key"],
    "properties": {
        "status": {"type": "string"},
        "idempotency_key": {"type": "string"},
        "order_id": {"type": ["string", "null"]},
        "request_digest": {"type": "string"},
        "accepted_at": {"type": ["string", "null"]},
        "broker_order_id": {"type": ["string", "null"]},
        "fills": {"type": "array"},
    },
}
ORDER_REQUEST: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["order_id", "instrument", "side", "qty", "idempotency_key", "requested_at"],
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"},
        "instrument": {"type": "string", "example": "USDJPY"},
        "side": {"type": "string", "enum": ["BUY", "SELL"]},
        "qty": {"type": "number", "minimum": 0.01, "maximum": 100, "multipleOf": 0.01, "description": "lots"},
        "price": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_PRICE,
            "description": "null for a market order",
        },
        "time_in_force": {"type": "string", "enum": ["IOC", "FOK", "GTC"], "default": "IOC"},
        "tags": {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1, "maxLength": 32}},
        "idempotency_key": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
        "requested_at": {"type": "string", "format": "date-time"},
        "risk_constraints": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_dd": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "max_consecutive_loss": {"type": "integer", "minimum": 0, "maximum": 1000},
                "max_spread": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            },
        },
    },
}
HEALTH = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"type": "string", "enum": ["ok"]}},
}
HEALTH_DEGRADED = {
    "type": "object",
    "required": ["status", "database", "error", "message"],
    "properties": {
        "status": {"type": "string", "enum": ["degraded"]},
        "database": {
            "type": "string",
            "enum": ["timeout", "unreachable"],
            "description": "timeout: no answer within 1 s; unreachable: the connection failed",
        },
        "error": {"type": "string", "enum": ["DATABASE_UNAVAILABLE"]},
        "message": {"type": "string"},
        "retry_after": {"type": "integer"},
    },
}
RETRY_AFTER = {
    "Retry-After": {
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
        "description": "seconds to wait before retrying",
    }
}
LEDGER = {
    "type": "object",
    "required": ["idempotency_key", "status"],
    "properties": {
        "idempotency_key": {"type": "string"},
        "status": {"type": "string", "enum": ["accepted", "succeeded", "failed"]},
        "http_status": {"type": ["integer", "null"]},
        "request_digest": {"type": "string"},
        "accepted_at": {"type": "string"},
        "updated_at": {"type": "string"},
        "expires_at": {"type": "string"},
        "result": {"type": ["object", "null"]},
        "result_digest": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(ERROR, description)


def order_request_schema() -> dict[str, Any]:
    """OrderRequest v1.1 as validated now: the instruments allowed (OUTBOX_INSTRUMENTS) are part of it."""
    instrument = {"type": "string", "enum": list(allowed_instruments()), "example": "USDJPY"}
    return {**ORDER_REQUEST, "properties": {**ORDER_REQUEST["properties"], "instrument": instrument}}


def _common_responses(rate_per_minute: int, auth_failures_per_minute: int) -> dict[str, Any]:
    """The answers every order route may give: 401, 429, 500, 503."""
    return {
        "401": _unauthorized(),
        "429": {
            **_error(
                f"RATE_LIMITED: over {rate_per_minute} requests per minute for this client, or over "
                f"{auth_failures_per_minute} failed authentications per minute from its address "
                "(checked before the token, so even a right token waits)"
            ),
            "headers": RETRY_AFTER,
        },
        "500": _error("INTERNAL_ERROR"),
        "503": {
            **_error(
                "DATABASE_BUSY: a lock or a full connection pool held the request past OUTBOX_API_DB_TIMEOUT "
                "(2 s), the transaction rolled back and nothing was stored; or DATABASE_UNAVAILABLE: the "
                "outbox database cannot be reached. Retry after Retry-After seconds with the same "
                "Idempotency-Key: the ledger makes the retry safe."
            ),
            "headers": RETRY_AFTER,
        },
    }


def _unauthorized() -> dict[str, Any]:
    return _error("UNAUTHORIZED: a bearer token is required (OUTBOX_API_TOKEN is set) or it is wrong")


def _submit_order(max_body: int, common: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "operationId": "submitOrder",
            "parameters": [
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": True,
                    "schema": {"type": "string", "maxLength": 128},
                    "description": "must equal body.idempotency_key",
                }
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": order_request_schema()}}},
            "responses": {
                "201": _json(ACK, f"accepted the first time: the order is in {ORDERS_TABLE}"),
                "200": _json(ACK, "an identical repeat: the stored answer (the ExecResult once executed)"),
                "400": _error("MALFORMED_JSON: the body is not UTF-8 JSON"),
                "409": _error("IDEMPOTENCY_CONFLICT: the same key with a different body"),
                "413": _error(f"PAYLOAD_TOO_LARGE: the body is over {max_body} bytes"),
                "415": _error("UNSUPPORTED_MEDIA_TYPE: send Content-Type: application/json"),
                "422": _error(
                    "IDEMPOTENCY_MISMATCH (header and body keys differ) or VALIDATION_ERROR (every violation listed)"
                ),
                **common,
            },
            "security": [{"bearer": []}, {}],
        }
    }


def _get_order(common: dict[str, Any]) -> dict[str, Any]:
    return {
        "get": {
            "operationId": "getOrder",
            "parameters": [
                {
                    "name": "key",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": KEY_PATTERN.pattern},
                    "description": "the Idempotency-Key of the order",
                }
            ],
            "responses": {
                "200": _json(LEDGER, "the ledger status, with the ExecResult once the broker answered"),
                "404": _error("NOT_FOUND: no order with this key for this caller"),
                **common,
            },
            "security": [{"bearer": []}, {}],
        }
    }


def _metrics(auth_failures_per_minute: int) -> dict[str, Any]:
    throttled = {
        **_error(
            f"RATE_LIMITED: over {auth_failures_per_minute} failed authentications per minute from "
            "this client address (checked before the token, so even a right token waits)"
        ),
        "headers": RETRY_AFTER,
    }
    return {
        "get": {
            "operationId": "metrics",
            "description": "Prometheus exposition. Needs the bearer token when "
            "OUTBOX_API_METRICS_REQUIRE_TOKEN is true (the default when OUTBOX_API_TOKEN is set).",
            "responses": {
                "200": {
                    "description": "the metrics, Prometheus text format 0.0.4",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": _unauthorized(),
                "429": throttled,
            },
            "security": [{"bearer": []}, {}],
        }
    }


def _health() -> dict[str, Any]:
    return {
        "get": {
            "operationId": "health",
            "description": "Answers within 1 s on a database connection of its own, "
            "whatever the request pool is doing.",
            "responses": {
                "200": _json(HEALTH, "up: the database answered"),
                "503": {
                    **_json(HEALTH_DEGRADED, "degraded: the database did not answer within 1 s or cannot be reached"),
                    "headers": RETRY_AFTER,
                },
            },
        }
    }


def document(rate_per_minute: int, max_body: int, auth_failures_per_minute: int = 10) -> dict[str, Any]:
    common = _common_responses(rate_per_minute, auth_failures_per_minute)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "outbox_pipelines Order API",
            "version": "1.1.0",
            "description": "OrderRequest v1.1 with an idempotency ledger (seed 001).",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/do/order": _submit_order(max_body, common),
            "/do/order/{key}": _get_order(common),
            "/metrics": _metrics(auth_failures_per_minute),
            "/healthz": _health(),
        },
    }
