"""Canonical JSON is json's text, whichever encoder writes it.

Stored digests and ``same_payload`` answers depend on the exact text: orjson
writes most payloads, json the ones orjson would write differently. The
reference below is the encoder the project used before orjson, spelled out.
"""

import enum
import json
import math
import random
import struct
import uuid
from collections import OrderedDict

import pytest

from outbox_pipelines import InvalidMessage
from outbox_pipelines.core.canonical import (
    MAX_NESTING_DEPTH,
    canonical_json,
    checked_canonical_payload,
    digest,
    plain_canonical_bytes,
)


def reference(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def assert_same_text(value):
    assert canonical_json(value) == reference(value), value


def test_every_kind_of_float_is_written_as_json_writes_it():
    rnd = random.Random(20261123)
    floats = [0.0, -0.0, 1e-4, 1e-5, 9.999999999999999e-5, 1e15, 1e16, 1e22, 5e-324, 1.7976931348623157e308, 0.1]
    for _ in range(40_000):
        floats.append(struct.unpack("d", struct.pack("Q", rnd.getrandbits(64)))[0])
        floats.append(rnd.random() * 10 ** rnd.randint(-30, 30))
        floats.append(round(rnd.random() * 10 ** rnd.randint(-8, 20), rnd.randint(0, 6)))
    finite = [f for f in floats if math.isfinite(f)]
    for start in range(0, len(finite), 50):
        assert_same_text({"x": finite[start : start + 50]})


def test_floats_orjson_writes_otherwise_are_left_to_json():
    # The forms orjson writes and json does not: 0.00001 and 1e-7 (json: 1e-05, 1e-07).
    assert plain_canonical_bytes({"x": 1e-5}) is None
    assert plain_canonical_bytes({"x": 1.5e-7}) is None
    assert canonical_json({"x": [1e-5, 1.5e-7]}) == '{"x":[1e-05,1.5e-07]}'
    assert plain_canonical_bytes({"x": 1.5}) == b'{"x":1.5}'


def test_every_character_is_written_as_json_writes_it():
    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    for start in range(0, len(code_points), 4096):
        text = "".join(map(chr, code_points[start : start + 4096]))
        assert_same_text({"s": text, text[:20]: 1})


def test_keys_are_sorted_as_json_sorts_them():
    rnd = random.Random(7)
    alphabet = [chr(c) for c in [*range(0x20, 0x7F), *range(0xA0, 0x800, 7), *range(0x10000, 0x10400, 13)]]
    for _ in range(2_000):
        assert_same_text({"".join(rnd.choices(alphabet, k=rnd.randint(0, 4))): n for n in range(8)})


class Colour(enum.Enum):
    RED = "red"
    SHAPE = {"sides": 3}


class Level(enum.IntEnum):
    HIGH = 3


class Tag(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"big": 2**63, "bigger": 2**64 - 1, "beyond": 2**64, "negative": -(2**63) - 1, "huge": 10**40},
        {"bool": True, "none": None, "nested": {"list": [1, [2, [3, {}]]], "tuple": (1, 2)}, "empty": []},
        {"sub": Tag("x"), Tag("key"): Level.HIGH, "ordered": OrderedDict(b=1, a=2)},
        {"quote": 'say "hi"', "slash": "a\\b/c", "controls": "\n\t\x01\x7f\x85", "line": "\u2028"},
    ],
)
def test_values_of_every_type_json_writes_have_the_same_text(value):
    assert_same_text(value)


def test_a_uuid_and_an_enum_are_accepted_alike_by_both_encoders():
    # orjson writes a UUID as its text and an Enum member as its value; json is given the same rule,
    # so whichever encoder a payload meets (a null sends it to json), the answer is the same.
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    payload = {"id": token, "colour": Colour.RED, "shape": Colour.SHAPE}
    expected = '{"colour":"red","id":"12345678-1234-5678-1234-567812345678","shape":{"sides":3}}'
    assert canonical_json(payload) == expected
    assert canonical_json({**payload, "none": None}) == expected.replace(',"shape"', ',"none":null,"shape"')


def test_not_a_number_is_refused_whichever_encoder_sees_it():
    for payload in ({"x": float("nan")}, {"x": [float("inf")], "y": None}, {"x": -math.inf}):
        with pytest.raises(InvalidMessage, match="NaN or infinity"):
            checked_canonical_payload(payload)


def test_depth_is_checked_even_where_orjson_would_nest_deeper():
    def nested(depth):
        value: dict = {}
        for _ in range(depth - 1):
            value = {"a": value}
        return value

    checked_canonical_payload(nested(MAX_NESTING_DEPTH))
    with pytest.raises(InvalidMessage, match=f"deeper than {MAX_NESTING_DEPTH}"):
        checked_canonical_payload(nested(MAX_NESTING_DEPTH + 1))
    # Many brackets, shallow: written and accepted.
    text, _ = checked_canonical_payload({"brackets": "[{" * 300, "list": [[1]] * 200})
    assert text == reference({"brackets": "[{" * 300, "list": [[1]] * 200})


def test_nul_is_refused_and_its_escape_written_as_text_is_not():
    with pytest.raises(InvalidMessage, match="u0000"):
        checked_canonical_payload({"a": "x\x00y"})
    text, sha = checked_canonical_payload({"a": "\\u0000"})
    assert text == '{"a":"\\\\u0000"}' and sha == digest(text)


def test_a_known_digest_is_unchanged():
    payload = {"order_id": "ord-1", "amount": 12.5, "tiny": 1.5e-7, "lines": [{"sku": "é", "qty": 2}], "note": None}
    text, sha = checked_canonical_payload(payload)
    assert text == ('{"amount":12.5,"lines":[{"qty":2,"sku":"é"}],"note":null,"order_id":"ord-1","tiny":1.5e-07}')
    assert sha == "sha256:" + __import__("hashlib").sha256(text.encode()).hexdigest()
