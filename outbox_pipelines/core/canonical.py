"""Canonical JSON and its sha256 digest, with the input checks of enqueue."""

import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from outbox_pipelines.core.errors import InvalidMessage

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
# Deepest nesting of objects and arrays accepted ({} is depth 1). Real messages nest a
# handful of levels; the cap turns a pathological body into InvalidMessage instead of a
# RecursionError in json (which gives up near 1,000 levels) or in a consumer.
MAX_NESTING_DEPTH = 100


# The application's encoder for types the rule below does not know (``set_payload_encoder``), or None.
_APPLICATION_ENCODER: list[Callable[[Any], Any]] = []


def set_payload_encoder(encoder: Callable[[Any], Any] | None) -> None:
    """Set, once at start-up, how payload and header values of the application's own types are written:
    ``encoder(value)`` returns a JSON-able value (a str, a dict, ...) or raises TypeError to refuse it. It is
    asked only for types the built-in rule does not write (``encode_value``); None removes it."""
    if encoder is not None and not callable(encoder):
        raise TypeError(f"the payload encoder must be a function, got {type(encoder).__name__}")
    _APPLICATION_ENCODER[:] = [encoder] if encoder is not None else []


def encode_value(value: Any) -> Any:
    """How a value JSON has no type for is written, the same on every path (json's and orjson's, sync and
    asyncio): a datetime, date or time as ISO 8601 (``isoformat()``: a datetime keeps its offset as given,
    ``+00:00`` for UTC), a Decimal as its exact text (``str``: ``"19.90"``), a UUID as its text, an Enum member
    as its value, a dataclass as an object of its fields, a pydantic model as ``model_dump(mode="json")``;
    then the application's encoder (``set_payload_encoder``). Anything else: TypeError."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise TypeError(f"Decimal {value} is not a number JSON can represent")
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _checked({field.name: getattr(value, field.name) for field in dataclasses.fields(value)})
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_fields"):  # a pydantic (v2) model
        return _checked(dump(mode="json"))
    if _APPLICATION_ENCODER:
        return _checked(_APPLICATION_ENCODER[0](value))
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _checked(value: Any) -> Any:
    # An object made here is checked as a payload's own are: string keys (json would turn others into
    # strings silently), bounded nesting.
    check_structure(value)
    return value


# One encoder for every call: json.dumps with options builds a new one each time, which
# costs as much as encoding a small payload.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=encode_value
)

# json's output above is the canonical form: stored digests and same_payload answers depend on it.
# orjson writes the same bytes 3x faster (sorting and the checks below included) except where its
# output says otherwise: it writes NaN and infinity as null (json refuses them) and a float below
# 1e-4 as 0.00001 or 1e-5 (json: 1e-05). So its text is kept only when it holds none of "null", a
# digit before "e-", or "0.0000"; otherwise (and for any type orjson declines: subclasses of str,
# int, dict and list, integers beyond 64 bits, lone surrogates, non-string keys) json writes it.
# Strings, key order and every other number are written alike (test_canonical_orjson.py compares).
_ORJSON_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_SMALL_FLOAT_EXPONENT = re.compile(rb"[0-9]e-")


def _orjson_canonical(value: Any) -> bytes | None:
    """``value``'s canonical JSON by orjson, or None where json must write it."""
    try:
        data = orjson.dumps(value, default=encode_value, option=_ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, InvalidMessage):
        return None
    # Three substring searches cost a third of one regular expression with the alternatives.
    if b"null" in data or b"0.0000" in data or (b"e-" in data and _SMALL_FLOAT_EXPONENT.search(data)):
        return None
    return data


def _json_canonical(value: Any) -> str:
    try:
        return _CANONICAL.encode(value)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise InvalidMessage("payload has a number JSON cannot represent (NaN or infinity)") from None
        raise InvalidMessage(f"payload is not JSON-serialisable: {exc}") from None
    except TypeError as exc:
        raise InvalidMessage(f"payload is not JSON-serialisable: {exc}") from None


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal text."""
    data = _orjson_canonical(value)
    return data.decode("utf-8") if data is not None else _json_canonical(value)


def digest(text: str) -> str:
    return digest_bytes(text.encode("utf-8"))


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _reject_nul(value: Any, path: str, what: str = "payload") -> None:
    # PostgreSQL's jsonb cannot store \u0000; say where it is instead of failing in SQL.
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidMessage(f"{what} string at {path} contains \\u0000, which PostgreSQL jsonb cannot store")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidMessage(f"{what} key {key!r} at {path} is not a string")
            if "\x00" in key:
                raise InvalidMessage(f"{what} key at {path} contains \\u0000")
            _reject_nul(item, f"{path}.{key}", what)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _reject_nul(item, f"{path}[{index}]", what)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidMessage(f"{what} number at {path} is {value}, which JSON cannot represent")


def check_structure(value: Any, what: str = "payload", max_depth: int = MAX_NESTING_DEPTH) -> None:
    """Nesting at most ``max_depth`` deep and only string keys, or InvalidMessage.

    Iterative (no recursion, whatever the depth) and it only visits containers,
    so a flat payload costs next to nothing. json.dumps would silently turn
    integer (or bool, None, float) keys into strings, so that the stored body
    is not the one given; refuse them instead. The walk keeps no paths (it runs
    for every message of a batch enqueue); only a message that fails is walked
    again to say where.
    """
    if isinstance(value, (dict, list, tuple)) and not _well_formed(value, 1, max_depth):
        _explain_structure(value, what, max_depth)


def _well_formed(node: dict[Any, Any] | list[Any] | tuple[Any, ...], depth: int, max_depth: int) -> bool:
    # Recursion is bounded by max_depth (far below Python's limit) and is the fastest walk.
    if depth > max_depth:
        return False
    if isinstance(node, dict):
        for key, item in node.items():
            if not isinstance(key, str):
                return False
            if isinstance(item, (dict, list, tuple)) and not _well_formed(item, depth + 1, max_depth):
                return False
        return True
    return all(_well_formed(item, depth + 1, max_depth) for item in node if isinstance(item, (dict, list, tuple)))


def _explain_structure(value: Any, what: str, max_depth: int) -> None:
    """The slow walk of a value ``check_structure`` refused: raise InvalidMessage naming where."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise InvalidMessage(
                f"{what} nests deeper than {max_depth} levels of objects and arrays (at {path}); "
                "flatten it or store the body elsewhere and enqueue a reference"
            )
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise InvalidMessage(
                        f"{what} key {key!r} at {path} is a {type(key).__name__}, not a string: JSON object keys "
                        "are strings (convert it yourself, e.g. str(key), so the stored body is what you meant)"
                    )
                if isinstance(item, (dict, list, tuple)):
                    stack.append((item, depth + 1, f"{path}.{key}"))
        else:
            for index, item in enumerate(node):
                if isinstance(item, (dict, list, tuple)):
                    stack.append((item, depth + 1, f"{path}[{index}]"))
    raise AssertionError("check_structure refused a value the explaining walk accepts")


def parse_payload(payload: Any, what: str = "payload") -> Any:
    """Accept a dict, or a str/bytes holding a JSON object."""
    if isinstance(payload, (bytes, bytearray)):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMessage(f"{what} bytes are not valid UTF-8") from None
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise InvalidMessage(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
        except RecursionError:
            raise InvalidMessage(
                f"{what} nests deeper than {MAX_NESTING_DEPTH} levels of objects and arrays; "
                "flatten it or store the body elsewhere and enqueue a reference"
            ) from None
    if not isinstance(payload, dict):
        raise InvalidMessage(f"{what} must be a JSON object, got {type(payload).__name__}")
    return payload


def plain_canonical_bytes(value: Any) -> bytes | None:
    """``value``'s canonical JSON as UTF-8 when orjson writes it and it plainly passes every check of
    ``checked_canonical_bytes`` (the common payload); None when that must look closer."""
    data = _orjson_canonical(value)
    if data is None or b"\\u0000" in data:
        return None
    # orjson nests up to 255 levels. Deeper than the limit takes more opening brackets than the
    # limit, and as many closing ones: a short or bracket-poor text is shallow enough.
    if len(data) > 2 * MAX_NESTING_DEPTH and data.count(b"{") + data.count(b"[") > MAX_NESTING_DEPTH:
        return None
    return data


def checked_canonical_bytes(value: Any, what: str = "payload") -> bytes:
    """``value``'s canonical JSON as UTF-8 once ``check_structure`` and the JSON limits pass, or InvalidMessage."""
    data = plain_canonical_bytes(value)
    if data is not None:
        return data
    check_structure(value, what)
    try:
        data = _json_canonical(value).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage(f"{what} contains a lone surrogate (text that is not valid Unicode)") from None
    # NUL is written as the escape \u0000, so one search of the text finds it; only on a hit
    # (which may also be a literal backslash-u0000) walk the value to say where.
    if b"\\u0000" in data:
        _reject_nul(json.loads(data), "$", what)  # the text as stored: values written by encode_value included
    return data


def checked_canonical_payload(
    payload: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, *, what: str = "payload"
) -> tuple[str, str]:
    """Return (canonical JSON text, sha256 digest) or raise InvalidMessage."""
    data = checked_canonical_bytes(parse_payload(payload, what), what)
    size = len(data)
    if size > max_bytes:
        raise InvalidMessage(
            f"{what} is {size} bytes, over the limit of {max_bytes} bytes "
            "(set OUTBOX_MAX_PAYLOAD_BYTES to change it, or store the body elsewhere and enqueue a reference)"
        )
    return data.decode("utf-8"), digest_bytes(data)


# jsonb text to Python, for every claimed payload and headers. orjson is 2.5x json's speed, but
# reads an integer beyond 64 bits as a float where json keeps it exact: a text with a run of 19
# digits or more is read by json instead (rare in a jsonb). The run is found by mapping every digit
# to "0" and every other byte to ".": a regular expression costs more than orjson's whole parse.
_decode_json = json.JSONDecoder().decode
_DIGITS_AS_ZEROS = bytes(ord("0") if 48 <= b <= 57 else ord(".") for b in range(256))
_LONG_NUMBER = b"0" * 19


def loads_jsonb_text(data: str | bytes | memoryview) -> Any:
    """PostgreSQL's text of a json/jsonb value (always valid JSON, UTF-8) as Python values, as json.loads
    reads it."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if _LONG_NUMBER not in raw.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return _decode_json(raw.decode("utf-8"))
