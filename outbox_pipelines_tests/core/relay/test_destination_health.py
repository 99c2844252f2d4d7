"""An outage shows while it lasts: relays record destination failure streaks; the destination check grades them."""

from datetime import timedelta

import pytest

from outbox_pipelines import Outcome
from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.relay.destination_health import SUCCESS_EVERY_S, DestinationGuard, read_health
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import db_now, enqueue_n, statuses
from outbox_pipelines_tests.processes import free_port
from outbox_pipelines_tests.rows import make_dead, make_due

EVENTS = "outbox_events"


def events_settings(**overrides):
    return table_settings(EVENTS, **{"mode": "competing", "idle_sleep_s": 0.01, **overrides})


@pytest.fixture
def closed_url() -> str:
    """A local port nobody listens on: connection refused."""
    return f"http://127.0.0.1:{free_port()}/"


def relay_once(db_url, url):
    destination = HttpDestination(url, timeout_s=2)
    try:
        return Relay(db_url, events_settings(), destination).run(once=True)
    finally:
        destination.close()


def health_row(conn):
    return conn.execute("SELECT * FROM outbox_destination_health WHERE table_name = %s", (EVENTS,)).fetchone()


def destination_verdict(conn, now=None):
    status = read_status(OutboxTable(conn, EVENTS), now=now)
    return {v.name: v for v in evaluate_checks(status, events_settings().checks)}["destination"]


def test_connection_refused_opens_a_streak_and_a_success_ends_it(db_url, conn, closed_url, http_sink):
    enqueue_n(conn, EVENTS, 3)
    report = relay_once(db_url, closed_url)
    assert (report.sent, report.retried) == (0, 3)
    assert report.destination_failures == {m.CONNECTION_REFUSED: 3}
    assert report.outcome == "destination_failing"
    assert report.as_dict()["outcome"] == "destination_failing"

    health = read_health(conn, EVENTS)
    assert health.failing and 0 <= health.failing_for_s < 30
    assert (health.destination, health.consecutive_failures, health.error_codes) == (
        closed_url.rstrip("/"),
        3,
        {m.CONNECTION_REFUSED: 3},
    )  # named by its origin
    assert "connection failed" in health.last_error
    started = health_row(conn)["failing_since"]
    assert started is not None

    # The outage goes on: the same streak grows, it does not restart.
    make_due(conn, EVENTS)
    relay_once(db_url, closed_url)
    health = read_health(conn, EVENTS)
    assert (health.consecutive_failures, health.error_codes) == (6, {m.CONNECTION_REFUSED: 6})
    assert health_row(conn)["failing_since"] == started

    # The destination is back: the first delivery ends the streak.
    make_due(conn, EVENTS)
    report = relay_once(db_url, http_sink.url)
    assert (report.sent, report.outcome, report.destination_failures) == (3, "delivered", {})
    assert statuses(conn, EVENTS) == {"sent": 3}
    health = read_health(conn, EVENTS)
    assert not health.failing
    assert (health.consecutive_failures, health.error_codes) == (0, {})
    assert health.last_success_at is not None
    assert health.destination == http_sink.url.rstrip("/")
    verdict = destination_verdict(conn, now=db_now(conn) + timedelta(seconds=3600))
    assert verdict.severity == "ok"
    assert verdict.description == f"{EVENTS}: {http_sink.url.rstrip('/')} is accepting deliveries."


@pytest.mark.parametrize("status, code", [(503, m.BROKER_5XX), (401, m.UNAUTHORIZED)])
def test_5xx_and_401_answers_are_destination_failures(db_url, conn, http_sink, status, code):
    enqueue_n(conn, EVENTS, 2)
    http_sink.script = lambda key, attempt, body: (status, {}, b"down")
    report = relay_once(db_url, http_sink.url)
    assert report.destination_failures == {code: 2}
    assert report.outcome == "destination_failing"
    health = read_health(conn, EVENTS)
    assert health.failing and health.error_codes == {code: 2}


def test_once_every_message_is_dead_the_check_says_to_replay_them_not_that_they_retry(db_url, conn, closed_url):
    """The outage spent every attempt: nothing is left to retry by itself, so the words change to a replay."""
    enqueue_n(conn, EVENTS, 3)
    assert relay_once(db_url, closed_url).outcome == "destination_failing"
    t0 = health_row(conn)["failing_since"]
    make_dead(conn, EVENTS, code=m.CONNECTION_REFUSED)  # as their last attempts leave them
    told = destination_verdict(conn, now=t0 + timedelta(seconds=60)).description
    assert "no message is left to retry: 3 are dead" in told and "replay them once it recovers" in told, told
    assert "retry by themselves" not in told and "nothing needs replaying" not in told


@pytest.mark.parametrize("status, outcome", [(400, "dead_letters"), (429, "idle")])
def test_a_bad_message_or_throttling_opens_no_streak(db_url, conn, http_sink, status, outcome):
    enqueue_n(conn, EVENTS, 1)
    http_sink.script = lambda key, attempt, body: (status, {"Retry-After": "1"}, b"no")
    report = relay_once(db_url, http_sink.url)
    assert report.destination_failures == {}
    assert report.outcome == outcome
    if status == 400:
        assert (report.dead, report.dead_by_code) == (1, {m.BAD_REQUEST: 1})
    else:
        assert report.rate_limited == 1
    assert not read_health(conn, EVENTS).failing
    assert destination_verdict(conn, now=db_now(conn) + timedelta(seconds=3600)).severity == "ok"


def test_the_destination_check_grades_how_long_the_outage_lasted(db_url, conn, closed_url):
    with_credentials = closed_url.replace("http://", "http://svc:secretpw@")
    enqueue_n(conn, EVENTS, 3)
    assert relay_once(db_url, with_credentials).outcome == "destination_failing"
    t0 = health_row(conn)["failing_since"]

    assert destination_verdict(conn, now=t0 + timedelta(seconds=10)).severity == "ok"
    warn = destination_verdict(conn, now=t0 + timedelta(seconds=31))  # destination_failing_warn: 30 s
    assert warn.severity == "warn"
    assert destination_verdict(conn, now=t0 + timedelta(seconds=301)).severity == "error"  # ..._error: 300 s

    shown = closed_url.rstrip("/")  # the origin: no user-info, no path
    assert warn.description.startswith(f"{EVENTS}: deliveries to {shown} have failed for 31 s (CONNECTION_REFUSED=3)")
    assert "3 messages wait and retry by themselves" in warn.description
    assert "nothing needs replaying" in warn.description
    assert warn.metadata["destination"] == shown
    assert warn.metadata["failing_for_s"] == pytest.approx(31, abs=0.01)
    for text in (warn.description, str(warn.metadata), str(health_row(conn))):
        assert "secretpw" not in text


def test_the_recorder_ignores_dedup_hits_and_a_partial_success_ends_the_streak(conn):
    recorder = DestinationGuard(EVENTS, "http://broker.example/")
    recorder.observe(conn, [Outcome.retry(m.BROKER_5XX, "HTTP 502"), Outcome.retry(m.NETWORK_TIMEOUT, "timeout")])
    assert read_health(conn, EVENTS).error_codes == {m.BROKER_5XX: 1, m.NETWORK_TIMEOUT: 1}
    # Answered from the table, not by the destination: says nothing about it.
    recorder.observe(conn, [Outcome.sent(ref="r", code=m.DEDUP_HIT)])
    assert read_health(conn, EVENTS).failing
    # A failure of one message (a handler error) neither opens nor extends a streak.
    recorder.observe(conn, [Outcome.retry(m.HANDLER_ERROR, "boom")])
    assert read_health(conn, EVENTS).consecutive_failures == 2
    # One delivery in a batch that otherwise failed: the destination works.
    recorder.observe(conn, [Outcome.sent(ref="ok"), Outcome.retry(m.BROKER_5XX, "HTTP 502")])
    health = read_health(conn, EVENTS)
    assert not health.failing and health.consecutive_failures == 0
    # Another relay of the same table opens a new streak; its own codes only.
    DestinationGuard(EVENTS, "http://broker.example/").observe(conn, [Outcome.retry(m.UNKNOWN, "garbled")])
    assert read_health(conn, EVENTS).error_codes == {m.UNKNOWN: 1}


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def test_a_run_of_delivered_batches_writes_the_success_row_at_most_once_per_interval(conn):
    clock = FakeClock()
    guard = DestinationGuard(EVENTS, "http://broker.example/", clock=clock)
    t0 = db_now(conn)
    written_at = set()
    for second in range(12):  # one delivered batch a second; the database time marks which batch wrote
        clock.seconds = float(second)
        guard.observe(conn, [Outcome.sent(ref=f"r{second}")], now=t0 + timedelta(seconds=second))
        written_at.add(read_health(conn, EVENTS).last_success_at - t0)
    assert sorted(written_at) == [timedelta(seconds=s) for s in (0, SUCCESS_EVERY_S, 2 * SUCCESS_EVERY_S)]

    # A streak opened meanwhile (by another relay) is ended by the next write, within the interval.
    DestinationGuard(EVENTS, "http://broker.example/").observe(
        conn, [Outcome.retry(m.BROKER_5XX, "HTTP 502")], now=t0 + timedelta(seconds=12)
    )
    clock.seconds = 13.0
    guard.observe(conn, [Outcome.sent(ref="r13")], now=t0 + timedelta(seconds=13))
    assert read_health(conn, EVENTS).failing
    clock.seconds = 15.0
    guard.observe(conn, [Outcome.sent(ref="r15")], now=t0 + timedelta(seconds=15))
    health = read_health(conn, EVENTS, now=t0 + timedelta(seconds=15))
    assert not health.failing and health.last_success_at == t0 + timedelta(seconds=15)

    # This relay's own failure ends its quiet interval: its next success is written at once.
    guard.observe(conn, [Outcome.retry(m.NETWORK_TIMEOUT, "timeout")], now=t0 + timedelta(seconds=16))
    clock.seconds = 16.5
    guard.observe(conn, [Outcome.sent(ref="r16")], now=t0 + timedelta(seconds=16.5))
    assert not read_health(conn, EVENTS).failing
