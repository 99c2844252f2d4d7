"""The body of a request: JSON only, uncompressed (415), within the size limit (413), valid UTF-8 JSON with each key
once (400).

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
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # never decoded here: read as it is, it would be another body
        raise Rejection(415, "UNSUPPORTED_MEDIA_TYPE", f"send the order uncompressed (Content-Encoding {encoding!r})")
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
        value = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
        # An escaped lone surrogate ("\ud800") parses, but is not Unicode text: it can be
        # neither digested nor stored, so it is malformed input, not a server error.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except _DuplicateKey as exc:
        raise Rejection(400, "MALFORMED_JSON", str(exc)) from None
    except (UnicodeError, ValueError, RecursionError):
        raise Rejection(400, "MALFORMED_JSON", "the body is not valid UTF-8 JSON") from None
    return value


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object, refused when it gives a key twice: parsers disagree on which one counts (the first, the last),
    so the order executed and the one its idempotency digest stands for could differ."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(f"the body gives the key {key[:80]!r} twice: send each key once")
        found[key] = value
    return found


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
