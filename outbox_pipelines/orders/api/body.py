"""The body of a request: JSON only (415), within the size limit (413), valid UTF-8 JSON (400).

The limit holds whatever Content-Length says (or without one): the body is read in chunks and
refused as soon as it is over. NaN, Infinity and lone surrogates are malformed input, not a
server error.
"""

import json
from typing import Any

from starlette.requests import Request

from outbox_pipelines.orders.api.responses import Rejection


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON value, read whole only when it is at most ``limit`` bytes."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise Rejection(415, "UNSUPPORTED_MEDIA_TYPE", "send the order as Content-Type: application/json")
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
