"""The mapping of HTTP answers to outcomes (docs/explanation/outcomes.md), without sockets."""

import email.utils
import json
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from outbox_pipelines.core.destinations.http.outcomes import classify_response, parse_retry_after
from outbox_pipelines.core.models import ERROR_TEXT_LIMIT
from outbox_pipelines.core.settings.already_processed import AlreadyProcessed

JSON = {"content-type": "application/json"}
# A fixed, far-from-now reference: a test that silently used the local clock would be off by years.
SERVER_NOW = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)


def http_date(when: datetime) -> str:
    return email.utils.format_datetime(when, usegmt=True)


def answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> httpx.Response:
    """A real httpx.Response (case-insensitive headers), as a destination sees one."""
    transport = httpx.MockTransport(lambda request: httpx.Response(status, headers=headers or {}, content=body))
    with httpx.Client(transport=transport) as client:
        return client.post("http://broker.test/orders", content=b"{}")


def classify(status: int, body: bytes = b"", headers: dict[str, str] | None = None, **kwargs):
    response = answer(status, body, headers)
    return classify_response(response.status_code, response.headers, response.content, **kwargs)


def as_tuple(outcome) -> tuple:
    return outcome.kind, outcome.code


# -- 2xx ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_every_2xx_is_sent(status):
    outcome = classify(status)
    assert as_tuple(outcome) == ("sent", None)
    assert outcome.error is None


def test_2xx_reference_is_the_brokers_id():
    body = json.dumps({"status": "accepted", "broker_order_id": "B-42", "id": "other"}).encode()
    assert classify(201, body, JSON).ref == "B-42"
    assert classify(200, b'{"id": 7}', JSON).ref == "7"


def test_2xx_without_an_id_is_referenced_by_the_digest_of_its_body():
    first = classify(200, b'{"ok": true}', JSON).ref
    assert first is not None and first.startswith("sha256:")
    assert classify(200, b'{"ok": true}', JSON).ref == first
    assert classify(200, b'{"ok": false}', JSON).ref != first


def test_2xx_that_declares_json_but_sends_garbage_is_retried_as_unknown():
    outcome = classify(200, b"<html>proxy error</html>", {"content-type": "application/json; charset=utf-8"})
    assert as_tuple(outcome) == ("retry", "UNKNOWN")
    assert "proxy error" in outcome.error


def test_2xx_with_a_non_json_body_it_does_not_claim_is_sent():
    assert classify(200, b"OK", {"content-type": "text/plain"}).kind == "sent"


# -- 409 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"status": "already_processed", "broker_order_id": "B-9"}',
        b'{"error": "already processed", "order_id": "B-9"}',
        b'{"error": "ALREADY_PROCESSED", "order_id": "B-9"}',
        b'{"code": "Already-Processed"}',
        b"already processed",
        b"Already processed.",
        b'"already processed"',
    ],
)
def test_409_already_processed_counts_as_sent(body):
    outcome = classify(409, body, JSON)
    assert as_tuple(outcome) == ("sent", "CONFLICT_PROCESSED")
    assert outcome.ref is not None


def test_409_already_processed_keeps_the_brokers_reference():
    assert classify(409, b'{"error": "already processed", "order_id": "B-9"}', JSON).ref == "B-9"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b'{"error": "IDEMPOTENCY_CONFLICT", "message": "body differs", "idempotency_key": "k"}',
        b"conflict",
        # issue 22: a rejection that merely mentions a word of the old marker list was recorded as delivered
        b'{"error": "duplicate rejected: different order"}',
        b"duplicate",
        b'{"error": "not already processed: key reused with another body"}',
        b"Request Already Processed by another tenant? no: rejected",
        b'{"message": "already processed"}',  # not a field the default rules read
        b'{"status": "rejected", "detail": "already_processed"}',
        b'{"status": ["already_processed"]}',
    ],
)
def test_409_without_already_processed_is_dead_bad_request(body):
    """Seed 000 §5: a duplicate rejection is not retried; only "already processed" counts as sent."""
    outcome = classify(409, body, JSON)
    assert as_tuple(outcome) == ("dead", "BAD_REQUEST")
    assert "409" in outcome.error


def test_a_table_names_its_destinations_own_evidence():
    """``already_processed`` in outbox.toml: the destination's documented field or phrase, nothing else."""
    rules = AlreadyProcessed.parse(["result.state=DUPLICATE_OF_EXECUTED", "Request Already Processed"])
    assert (
        classify(409, b'{"result": {"state": "duplicate_of_executed"}, "id": "X"}', JSON, already_processed=rules).kind
        == "sent"
    )
    assert classify(409, b"request already processed", {}, already_processed=rules).kind == "sent"
    # the defaults are replaced, not added to
    assert classify(409, b'{"status": "already_processed"}', JSON, already_processed=rules).kind == "dead"
    # no rules: every 409 is a rejection
    assert (
        classify(409, b'{"status": "already_processed"}', JSON, already_processed=AlreadyProcessed.parse([])).kind
        == "dead"
    )


@pytest.mark.parametrize("rule", ["=x", "status=", "a..b=x", "  ", 3])
def test_an_unreadable_evidence_rule_is_refused(rule):
    with pytest.raises(ValueError):
        AlreadyProcessed.parse([rule])


# -- 429 and Retry-After ------------------------------------------------------------------------


def test_429_is_rate_limited_with_retry_after_seconds():
    outcome = classify(429, b'{"error": "slow down"}', {**JSON, "Retry-After": "30"})
    assert as_tuple(outcome) == ("retry", "RATE_LIMITED")
    assert outcome.delay_s == 30


def test_429_retry_after_http_date_is_measured_against_the_responses_date_header():
    headers = {"Date": http_date(SERVER_NOW), "Retry-After": http_date(SERVER_NOW + timedelta(seconds=120))}
    # now_epoch is the local clock, 3 hours off the server's: the answer must not depend on it.
    local = (SERVER_NOW + timedelta(hours=3)).timestamp()
    outcome = classify(429, b"", headers, now_epoch=local)
    assert as_tuple(outcome) == ("retry", "RATE_LIMITED")
    assert outcome.delay_s == pytest.approx(120)


def test_429_without_retry_after_leaves_the_delay_to_the_backoff():
    outcome = classify(429)
    assert as_tuple(outcome) == ("retry", "RATE_LIMITED")
    assert outcome.delay_s is None


@pytest.mark.parametrize("value", ["soon", "", "   ", "-5", "nan", "inf", "1e400", "Thu, 99 Foo 2015 99:99:99 GMT"])
def test_429_with_an_invalid_retry_after_has_no_delay(value):
    outcome = classify(429, b"", {"Retry-After": value})
    assert as_tuple(outcome) == ("retry", "RATE_LIMITED")
    assert outcome.delay_s is None


def test_parse_retry_after_seconds():
    assert parse_retry_after("0") == 0
    assert parse_retry_after(" 120 ") == 120
    assert parse_retry_after(None) is None


def test_parse_retry_after_date_uses_the_date_header_over_the_local_clock():
    retry_at = http_date(SERVER_NOW + timedelta(seconds=90))
    far_local_clock = (SERVER_NOW - timedelta(days=2)).timestamp()
    waited = parse_retry_after(retry_at, now_epoch=far_local_clock, date_header=http_date(SERVER_NOW))
    assert waited == pytest.approx(90)


def test_parse_retry_after_date_without_a_date_header_uses_now():
    retry_at = http_date(SERVER_NOW + timedelta(seconds=45))
    assert parse_retry_after(retry_at, now_epoch=SERVER_NOW.timestamp()) == pytest.approx(45)
    # An unreadable Date header is ignored, not fatal.
    assert parse_retry_after(retry_at, now_epoch=SERVER_NOW.timestamp(), date_header="yesterday") == pytest.approx(45)


def test_parse_retry_after_date_in_the_past_is_no_wait():
    retry_at = http_date(SERVER_NOW - timedelta(minutes=5))
    assert parse_retry_after(retry_at, date_header=http_date(SERVER_NOW)) == 0


# -- 5xx / 4xx / others -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_5xx_is_retried_as_broker_5xx(status):
    outcome = classify(status, b"upstream unavailable")
    assert as_tuple(outcome) == ("retry", "BROKER_5XX")
    assert str(status) in outcome.error


def test_503_with_retry_after_carries_the_delay():
    assert classify(503, b"", {"Retry-After": "12"}).delay_s == 12


@pytest.mark.parametrize("status", [400, 422])
def test_400_and_422_are_dead_bad_request(status):
    outcome = classify(status, b'{"error": "quantity must be positive"}', JSON)
    assert as_tuple(outcome) == ("dead", "BAD_REQUEST")
    assert "quantity must be positive" in outcome.error


@pytest.mark.parametrize("status", [402, 404, 405, 406, 410, 411, 413, 414, 415, 418, 421, 451, 499])
def test_every_other_4xx_is_dead_bad_request_at_once(status):
    """Seed 000 §5: 4xx is not retried, except 408 and 429 (and 401/403 are UNAUTHORIZED)."""
    outcome = classify(status, b"no such endpoint")
    assert as_tuple(outcome) == ("dead", "BAD_REQUEST")
    assert f"HTTP {status}" in outcome.error and "no such endpoint" in outcome.error


@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_are_dead_unauthorized(status):
    outcome = classify(status, b'{"error": "bad token s3cret"}', JSON)
    assert as_tuple(outcome) == ("dead", "UNAUTHORIZED")
    assert "OUTBOX_BROKER_TOKEN" in outcome.error
    assert "s3cret" not in outcome.error, "an answer to a refused credential may echo it: not stored"


def test_408_is_a_network_timeout_retry():
    outcome = classify(408, b"request took too long")
    assert as_tuple(outcome) == ("retry", "NETWORK_TIMEOUT")
    assert outcome.delay_s is None


@pytest.mark.parametrize("status", [100, 199, 301, 304, 600, 999])
def test_unexpected_statuses_are_retried_as_unknown(status):
    outcome = classify_response(status, {}, b"teapot")
    assert as_tuple(outcome) == ("retry", "UNKNOWN")
    assert str(status) in outcome.error


# Seed 000 §5 / §7, row by row: (status, kind, code).
SEED_000_TABLE = [
    (200, "sent", None),
    (201, "sent", None),
    (202, "sent", None),
    (400, "dead", "BAD_REQUEST"),
    (401, "dead", "UNAUTHORIZED"),
    (403, "dead", "UNAUTHORIZED"),
    (404, "dead", "BAD_REQUEST"),
    (405, "dead", "BAD_REQUEST"),
    (408, "retry", "NETWORK_TIMEOUT"),
    (409, "dead", "BAD_REQUEST"),
    (410, "dead", "BAD_REQUEST"),
    (413, "dead", "BAD_REQUEST"),
    (422, "dead", "BAD_REQUEST"),
    (429, "retry", "RATE_LIMITED"),
    (500, "retry", "BROKER_5XX"),
    (502, "retry", "BROKER_5XX"),
    (503, "retry", "BROKER_5XX"),
    (504, "retry", "BROKER_5XX"),
    (302, "retry", "UNKNOWN"),
]


@pytest.mark.parametrize(("status", "kind", "code"), SEED_000_TABLE)
def test_the_seed_000_table_row_by_row(status, kind, code):
    assert as_tuple(classify(status, b"{}", JSON)) == (kind, code)


def test_409_already_processed_is_the_only_409_that_counts_as_sent():
    assert as_tuple(classify(409, b'{"status": "already_processed", "broker_order_id": "B-1"}', JSON)) == (
        "sent",
        "CONFLICT_PROCESSED",
    )
    assert as_tuple(classify(409, b'{"error": "order rejected: key in use"}', JSON)) == ("dead", "BAD_REQUEST")


def test_error_text_of_a_huge_answer_stays_short():
    huge = b"x" * 1_000_000
    for status in (500, 400, 409, 429, 418):
        outcome = classify_response(status, {}, huge)
        assert outcome.error is not None and len(outcome.error) <= ERROR_TEXT_LIMIT


def test_error_text_of_a_binary_answer_is_readable_text():
    outcome = classify_response(502, {}, b"\x00\xff\xfe bad gateway \x00")
    assert outcome.kind == "retry"
    assert "\x00" not in outcome.error  # PostgreSQL text cannot hold NUL
    assert "bad gateway" in outcome.error


# -- HTTP dates are UTC whatever the local zone (RFC 9110 §5.6.7) --------------------------------


@pytest.fixture
def local_zone_far_from_utc(monkeypatch):
    """Run the test with the process's local time zone at UTC+9."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    "retry_after",
    [
        "Wed, 21 Oct 2015 07:30:00 GMT",  # IMF-fixdate
        "Wednesday, 21-Oct-15 07:30:00 GMT",  # obsolete RFC 850 form
        "Wed Oct 21 07:30:00 2015",  # obsolete asctime form: no zone, and it is UTC
        "Wed, 21 Oct 2015 07:30:00 -0000",
    ],
)
@pytest.mark.parametrize("date_header", ["Wed, 21 Oct 2015 07:28:00 GMT", "Wed Oct 21 07:28:00 2015"])
def test_retry_after_date_forms_are_read_as_utc(local_zone_far_from_utc, retry_after, date_header):
    assert parse_retry_after(retry_after, date_header=date_header) == pytest.approx(120)
    outcome = classify(429, b"", {"Date": date_header, "Retry-After": retry_after})
    assert outcome.delay_s == pytest.approx(120)
