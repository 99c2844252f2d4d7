"""The standard types a business payload holds are written by one documented rule (``encode_value``), the same
whichever encoder writes the text and whichever path enqueues it; the application may add its own types once
(``set_payload_encoder``)."""

import asyncio
import dataclasses
import enum
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import psycopg
import pydantic
import pytest

from outbox_pipelines import InvalidMessage, Message, Outbox, set_payload_encoder
from outbox_pipelines.core.canonical import canonical_json, checked_canonical_payload, digest

OUTBOX = Outbox("outbox_events")


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Line:
    sku: str
    price: Decimal
    shipped_on: date


class Customer(pydantic.BaseModel):
    id: uuid.UUID
    since: datetime


ORDER_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
PLACED = datetime(2026, 11, 29, 1, 2, 3, 456789, tzinfo=UTC)
# What each value is written as: the documented rule.
RULE = {
    "aware": (PLACED, "2026-11-29T01:02:03.456789+00:00"),
    "offset": (datetime(2026, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=9))), "2026-01-02T03:04:00+09:00"),
    "naive": (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05"),
    "date": (date(2026, 2, 3), "2026-02-03"),
    "time": (time(4, 5, 6), "04:05:06"),
    "decimal": (Decimal("19.90"), "19.90"),
    "uuid": (ORDER_ID, "12345678-1234-5678-1234-567812345678"),
    "enum": (Colour.RED, "red"),
}


@pytest.fixture(autouse=True)
def _no_application_encoder() -> Iterator[None]:
    yield
    set_payload_encoder(None)


@pytest.mark.parametrize("name", RULE)
def test_each_standard_type_is_written_by_the_rule_on_both_encoders(name):
    value, written = RULE[name]
    # A None beside it sends the payload through json instead of orjson (core/canonical.py): both give the rule.
    for payload in ({"v": value}, {"v": value, "n": None}):
        text, sha = checked_canonical_payload(payload)
        expected = canonical_json({**payload, "v": written})
        assert text == expected
        assert sha == digest(expected)


def test_dataclasses_and_pydantic_models_are_written_as_objects_of_their_fields():
    payload = {
        "line": Line("A-1", Decimal("2.50"), date(2026, 3, 4)),
        "customer": Customer(id=ORDER_ID, since=PLACED),
    }
    text, _ = checked_canonical_payload(payload)
    assert text == canonical_json(
        {
            "line": {"sku": "A-1", "price": "2.50", "shipped_on": "2026-03-04"},
            "customer": {"id": str(ORDER_ID), "since": "2026-11-29T01:02:03.456789Z"},
        }
    )


def test_what_json_cannot_hold_is_refused_saying_what():
    with pytest.raises(InvalidMessage, match="Decimal NaN is not a number JSON can represent"):
        checked_canonical_payload({"v": Decimal("NaN")})
    with pytest.raises(InvalidMessage, match="Object of type set is not JSON serializable"):
        checked_canonical_payload({"v": {1, 2}})
    with pytest.raises(InvalidMessage, match=r"\\u0000"):
        checked_canonical_payload({"line": Line("A\x00", Decimal(1), date(2026, 1, 1))})
    with pytest.raises(InvalidMessage, match="key 1 .* is a int, not a string"):
        checked_canonical_payload({"v": Line({1: "x"}, Decimal(1), date(2026, 1, 1))})  # type: ignore[arg-type]


def test_the_applications_encoder_writes_its_own_types_and_is_asked_for_nothing_else():
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

    asked: list[object] = []

    def encode(value: object) -> object:
        asked.append(value)
        if isinstance(value, Money):
            return {"cents": value.cents, "currency": "EUR"}
        raise TypeError(f"cannot write {type(value).__name__}")

    set_payload_encoder(encode)
    text, _ = checked_canonical_payload({"total": Money(1990), "at": PLACED})
    assert text == canonical_json({"total": {"cents": 1990, "currency": "EUR"}, "at": RULE["aware"][1]})
    assert [type(value) for value in asked] == [Money]  # the datetime took the built-in rule
    with pytest.raises(InvalidMessage, match="cannot write frozenset"):
        checked_canonical_payload({"v": frozenset()})
    set_payload_encoder(None)
    with pytest.raises(InvalidMessage, match="Object of type Money is not JSON serializable"):
        checked_canonical_payload({"total": Money(1)})


def test_sync_and_async_enqueue_store_the_same_body_and_digest(db_url, conn):
    payload = {
        "order_id": ORDER_ID,
        "placed_at": PLACED,
        "total": Decimal("19.90"),
        "lines": [Line("A-1", Decimal("2.50"), date(2026, 3, 4))],
        "customer": Customer(id=ORDER_ID, since=PLACED),
        "colour": Colour.RED,
    }
    headers = {"placed_at": PLACED}
    with conn.transaction():
        OUTBOX.enqueue(conn, Message(topic="t", payload=payload, headers=headers, event_id="sync"))

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as pg:
            await OUTBOX.enqueue_async(pg, Message(topic="t", payload=payload, headers=headers, event_id="async"))
            await OUTBOX.enqueue_many_async(
                pg, [Message(topic="t", payload=payload, headers=headers, event_id="async-many")]
            )
            await pg.commit()

    asyncio.run(scenario())
    rows = conn.execute("SELECT event_id, payload, payload_sha, headers FROM outbox_events ORDER BY id").fetchall()
    assert [row["event_id"] for row in rows] == ["sync", "async", "async-many"]
    assert rows[0]["payload"]["placed_at"] == "2026-11-29T01:02:03.456789+00:00"
    assert rows[0]["payload"]["total"] == "19.90"
    assert rows[0]["headers"] == {"placed_at": "2026-11-29T01:02:03.456789+00:00"}
    assert {(row["payload_sha"], str(row["payload"]), str(row["headers"])) for row in rows} == {
        (rows[0]["payload_sha"], str(rows[0]["payload"]), str(rows[0]["headers"]))
    }
