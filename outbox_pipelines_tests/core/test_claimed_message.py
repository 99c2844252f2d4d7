"""A claimed message built from a claim's row is the same value the dataclass constructor makes."""

import dataclasses
from datetime import UTC, datetime

import pytest

from outbox_pipelines.core.models import ClaimedMessage

ROW = (
    7,
    "evt-7",
    "acme",
    "order.created",
    {"order_id": 7},
    "sha256:ab",
    {"trace_id": "t7"},
    2,
    datetime(2026, 11, 23, 12, 0, tzinfo=UTC),
    datetime(2026, 11, 23, 12, 1, tzinfo=UTC),
    "order-7",
)


def test_from_row_equals_the_constructor_and_stays_frozen():
    built, constructed = ClaimedMessage.from_row(ROW), ClaimedMessage(*ROW)
    assert built == constructed
    assert list(vars(built)) == [f.name for f in dataclasses.fields(ClaimedMessage)]  # every field, no other
    assert dataclasses.astuple(built) == dataclasses.astuple(constructed)
    assert (built.trace_id, dataclasses.replace(built, attempts=3).attempts) == ("t7", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.attempts = 5  # type: ignore[misc]


def test_from_row_refuses_a_row_of_the_wrong_shape():
    with pytest.raises(ValueError):
        ClaimedMessage.from_row(ROW[:-1])
