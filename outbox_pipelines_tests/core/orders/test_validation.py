"""OrderRequest v1.1 validation edge cases found by fuzzing (no exception, a listed violation)."""

import pytest

from outbox_pipelines import InvalidMessage, Message, Outbox
from outbox_pipelines.orders.validation import validate_order
from outbox_pipelines_tests.helpers import order_payload


def fields(body):
    return {v.field for v in validate_order(body)}


@pytest.mark.parametrize(
    "field, value",
    [
        ("price", 10**400),
        ("price", -(10**400)),
        ("risk_constraints", {"max_dd": 10**400}),
        ("risk_constraints", {"max_spread": 10**400}),
    ],
)
def test_integers_beyond_float_range_are_violations_not_crashes(field, value):
    body = {**order_payload(1), field: value}
    assert fields(body) & {field, f"{field}.max_dd", f"{field}.max_spread"}


def test_an_integral_float_is_an_integer():
    assert fields({**order_payload(1), "risk_constraints": {"max_consecutive_loss": 3.0}}) == set()
    fractional = {**order_payload(1), "risk_constraints": {"max_consecutive_loss": 3.5}}
    assert "risk_constraints.max_consecutive_loss" in fields(fractional)


@pytest.mark.parametrize("value", ["2025-W01-1T00:00:00Z", "20250101T000000Z", "2025-08-24", "2025-08-24T00:00:00"])
def test_requested_at_must_be_rfc3339_with_a_zone(value):
    assert "requested_at" in fields({**order_payload(1), "requested_at": value})


def test_lone_surrogates_are_violations_and_never_reach_the_database(conn):
    assert "$" in fields({**order_payload(1), "tags": ["\ud800"]})
    with pytest.raises(InvalidMessage, match="lone surrogate"):
        Outbox("outbox_events").enqueue(conn, Message(topic="t", payload={"s": "\udfff"}), outside_transaction=True)
