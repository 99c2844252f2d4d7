"""health.evaluate_checks on its own: each check graded ok / warn / error at its thresholds, with the
sentence on-call reads. No database: a TableStatus is what the snapshot would have read."""

from datetime import UTC, datetime

import pytest

from outbox_pipelines.core.oncall.health import CHECK_NAMES, CheckVerdict, TableStatus, evaluate_checks
from outbox_pipelines.core.relay.destination_health import DestinationHealth
from outbox_pipelines.core.settings import CheckThresholds

TABLE = "outbox_events"
LIMITS = CheckThresholds(
    lag_p95_warn_s=60,
    lag_p95_error_s=300,
    oldest_pending_warn_s=300,
    oldest_pending_error_s=1800,
    dead_warn=1,
    dead_error=100,
    stuck_warn=1,
    stuck_error=50,
    backlog_warn=10_000,
    backlog_error=100_000,
    destination_failing_warn_s=30,
    destination_failing_error_s=300,
)


def status(**fields) -> TableStatus:
    counts = {"pending": 0, "retrying": 0, "sending": 0, "sent": 0, "dead": 0, **fields.pop("counts", {})}
    return TableStatus(TABLE, counts=counts, **fields)


def check(name: str, table_status: TableStatus, limits: CheckThresholds = LIMITS) -> CheckVerdict:
    return {v.name: v for v in evaluate_checks(table_status, limits)}[name]


def test_every_check_in_its_order_and_a_quiet_table_passes_them_all():
    verdicts = evaluate_checks(status(), LIMITS)
    assert [v.name for v in verdicts] == list(CHECK_NAMES)
    assert [(v.severity, v.passed) for v in verdicts] == [("ok", True)] * len(CHECK_NAMES)
    texts = {v.name: v.description for v in verdicts}
    assert texts["dead_letters"] == "outbox_events: 0 dead messages."
    assert texts["destination"] == "outbox_events: its destination is accepting deliveries."
    assert texts["stuck"] == ("outbox_events: 0 messages held in sending past their lease or the stuck threshold.")


# The lag check grades what waits now (pending and due, or in flight), each message timed from when it became
# due: lag_now_p95_s against lag_p95_*, lag_now_s (the oldest) against oldest_pending_*. The created -> delivered
# figures (lag_p95_s, oldest_waiting_age_s) are shown in the metadata, never graded: the statuses below set them
# far past every threshold, as after the replay of a message created days ago.
WINDOW = {"lag_p95_s": 5000.0, "lag_p99_s": 3 * 86400.0, "lag_sample": 40}
CREATED_DAYS_AGO = 3 * 86400.0


@pytest.mark.parametrize(
    ("p95_s", "severity"),
    [
        (0.0, "ok"),
        (59.9, "ok"),
        (60.0, "warn"),
        (299.0, "warn"),
        (300.0, "error"),
        (5000.0, "error"),
    ],
)
def test_lag_is_graded_on_the_p95(p95_s, severity):
    # 20 waiting, all due p95_s ago: the oldest (as old as the p95) is never graded worse than the p95 here.
    verdict = check(
        "lag",
        status(
            counts={"pending": 20},
            waiting_now=20,
            lag_now_p95_s=p95_s,
            lag_now_s=p95_s,
            oldest_waiting_age_s=CREATED_DAYS_AGO,
            **WINDOW,
        ),
    )
    assert verdict.severity == severity
    assert verdict.metadata["lag_now_p95_s"] == p95_s and verdict.metadata["lag_p95_warn_s"] == 60
    assert verdict.metadata["lag_p95_s"] == 5000.0  # the last hour's deliveries: shown, not graded


@pytest.mark.parametrize(("oldest_s", "severity"), [(299.0, "ok"), (300.0, "warn"), (1800.0, "error")])
def test_lag_is_also_graded_on_the_oldest_waiting_message(oldest_s, severity):
    # 500 waiting, their p95 1 s: one message, due oldest_s ago, is late.
    verdict = check(
        "lag",
        status(
            counts={"pending": 500},
            waiting_now=500,
            lag_now_p95_s=1.0,
            lag_now_s=oldest_s,
            oldest_waiting_age_s=CREATED_DAYS_AGO,
            **WINDOW,
        ),
    )
    assert verdict.severity == severity
    assert verdict.metadata["lag_now_s"] == oldest_s and verdict.metadata["oldest_waiting_warn_s"] == 300
    assert verdict.metadata["oldest_waiting_age_s"] == CREATED_DAYS_AGO  # from created_at: shown, not graded


def test_lag_takes_the_worse_of_its_two_figures_and_says_what_to_check():
    # p95 past its error threshold, the oldest only past its warn one
    verdict = check(
        "lag",
        status(
            lag_now_p95_s=400.0,
            lag_now_s=410.0,
            waiting_now=5,
            counts={"pending": 4, "sending": 1},
            oldest_waiting_age_s=CREATED_DAYS_AGO,
        ),
    )
    assert verdict.severity == "error"
    assert verdict.description == (
        "outbox_events: messages wait too long: lag p95 6.7 min (warn at 60 s), oldest waiting message "
        "due 6.8 min ago (warn at 5 min), 5 waiting. Check that a relay run is active for the table and what the "
        "destination check says."
    )
    # the other way round: p95 fine, the oldest past its error threshold
    assert (
        check("lag", status(lag_now_p95_s=2.0, lag_now_s=1900.0, waiting_now=500, counts={"pending": 500})).severity
        == "error"
    )
    # p95 past its warn threshold, the oldest fine
    assert (
        check("lag", status(lag_now_p95_s=90.0, lag_now_s=100.0, waiting_now=50, counts={"pending": 50})).severity
        == "warn"
    )
    quiet = check("lag", status(lag_now_p95_s=2.5, lag_now_s=3.0, waiting_now=1, counts={"pending": 1}, **WINDOW))
    assert quiet.severity == "ok"
    assert quiet.description == (
        "outbox_events: lag p95 2.5 s (warn at 60 s), oldest waiting message due 3 s ago (warn at 5 min), 1 waiting."
    )


def test_lag_with_nothing_due_passes_and_tells_what_waits_for_later():
    """A retry in backoff (created days ago) is not late until its backoff ends; nothing waiting passes with 0,
    whatever the last hour's deliveries took."""
    backoff = check(
        "lag", status(counts={"retrying": 1}, oldest_waiting_age_s=CREATED_DAYS_AGO, next_due_in_s=300.0, **WINDOW)
    )
    assert backoff.severity == "ok"
    assert backoff.description == (
        "outbox_events: nothing waiting, lag 0s (1 more not due yet: retrying after a backoff, scheduled, or "
        "behind an earlier message of their key)."
    )
    quiet = check("lag", status(**WINDOW))
    assert (quiet.severity, quiet.description) == ("ok", "outbox_events: nothing waiting, lag 0s.")
    assert (quiet.metadata["waiting_now"], quiet.metadata["lag_now_s"], quiet.metadata["lag_now_p95_s"]) == (0, 0, 0)


@pytest.mark.parametrize(("dead", "severity"), [(0, "ok"), (1, "warn"), (99, "warn"), (100, "error")])
def test_dead_letters_are_graded_on_the_count(dead, severity):
    by_code = {"BROKER_5XX": dead} if dead else {}
    assert check("dead_letters", status(counts={"dead": dead}, dead_by_code=by_code)).severity == severity


def test_dead_letters_name_the_codes_and_the_replay_dry_run_of_the_commonest():
    verdict = check(
        "dead_letters", status(counts={"dead": 1201}, dead_by_code={"NETWORK_TIMEOUT": 1200, "BAD_REQUEST": 1})
    )
    assert verdict.description == (
        "outbox_events: 1,201 dead messages (NETWORK_TIMEOUT=1,200, BAD_REQUEST=1). See what died with "
        "'outbox-pipelines replay --table outbox_events --error-code NETWORK_TIMEOUT --dry-run' (or "
        "replay_dead_job, a dry run first), fix the cause, then replay. BAD_REQUEST rows are requests the "
        "destination refused or that could not be built from the message (the dry run lists each row's last "
        "error): unchanged they fail again, so replay refuses them unless forced (--force / force: true), once "
        "the message or the destination is fixed."
    )
    assert verdict.metadata["dead_NETWORK_TIMEOUT"] == 1200 and verdict.metadata["dead_BAD_REQUEST"] == 1
    timeouts = check("dead_letters", status(counts={"dead": 3}, dead_by_code={"NETWORK_TIMEOUT": 3}))
    assert "force" not in timeouts.description  # replay takes them as they are
    one = check("dead_letters", status(counts={"dead": 1}, dead_by_code={"UNKNOWN": 1}))
    assert one.description.startswith("outbox_events: 1 dead message (UNKNOWN=1).")


@pytest.mark.parametrize(("stuck", "severity"), [(0, "ok"), (1, "warn"), (49, "warn"), (50, "error")])
def test_stuck_is_graded_on_the_rows_held_past_their_lease(stuck, severity):
    assert check("stuck", status(stuck=stuck, counts={"sending": stuck})).severity == severity


def test_stuck_says_how_to_return_the_rows():
    verdict = check("stuck", status(stuck=2, counts={"sending": 7}))
    assert verdict.description == (
        "outbox_events: 2 messages held in sending past their lease or the stuck threshold; their relay is "
        "probably gone. requeue_stuck_job (or 'outbox-pipelines requeue-stuck --table outbox_events') returns "
        "them to pending."
    )
    assert (verdict.metadata["stuck"], verdict.metadata["sending"]) == (2, 7)


@pytest.mark.parametrize(
    ("pending", "retrying", "severity"),
    [
        (9_999, 0, "ok"),
        (9_000, 1_000, "warn"),
        (99_999, 0, "warn"),
        (60_000, 40_000, "error"),
    ],
)
def test_backlog_is_graded_on_pending_plus_retrying(pending, retrying, severity):
    verdict = check("backlog", status(counts={"pending": pending, "retrying": retrying, "sending": 500}))
    assert verdict.severity == severity
    assert verdict.metadata["backlog"] == pending + retrying  # in flight is not backlog


def test_backlog_says_what_drains_it():
    verdict = check("backlog", status(counts={"pending": 12_000, "retrying": 345}, ready=12_000))
    assert verdict.description == (
        "outbox_events: 12,345 messages waiting (12,000 ready now; warn at 10,000). Relay runs drain it; if it "
        "keeps growing, check the destination and add relay processes."
    )
    assert check("backlog", status(counts={"pending": 1}, ready=1)).description == (
        "outbox_events: 1 message waiting (1 ready now; warn at 10,000)."
    )


@pytest.mark.parametrize(
    ("failing_for_s", "severity"),
    [
        (None, "ok"),
        (29.0, "ok"),
        (30.0, "warn"),
        (299.0, "warn"),
        (300.0, "error"),
    ],
)
def test_destination_is_graded_on_how_long_it_has_failed(failing_for_s, severity):
    health = DestinationHealth(TABLE, "http://broker/orders", failing_for_s=failing_for_s)
    assert check("destination", status(destination=health)).severity == severity


def test_destination_failing_with_an_open_circuit_and_a_pause_tells_all_three():
    health = DestinationHealth(
        TABLE,
        "http://broker/orders",
        failing_for_s=150.0,
        consecutive_failures=12,
        error_codes={"NETWORK_TIMEOUT": 10, "BROKER_5XX": 2},
        last_error="connection refused",
        last_success_at=datetime(2026, 1, 1, tzinfo=UTC),
        paused_for_s=20.0,
        circuit_opened_at=datetime(2026, 1, 1, 0, 5, tzinfo=UTC),
    )
    verdict = check("destination", status(destination=health, counts={"pending": 40, "retrying": 2}))
    assert verdict.severity == "warn"
    assert verdict.description == (
        "outbox_events: deliveries to http://broker/orders have failed for 2.5 min (NETWORK_TIMEOUT=10, "
        "BROKER_5XX=2); 42 messages wait and retry by themselves. Check the destination; nothing is lost and "
        "nothing needs replaying. The circuit is open: one probe message at a time, no attempts spent; delivery "
        "resumes by itself on the first success. The destination asked to slow down: paused for 20 s more."
    )
    assert verdict.metadata["circuit"] == "open" and verdict.metadata["paused_for_s"] == 20.0
    assert verdict.metadata["last_success_at"] == "2026-01-01T00:00:00+00:00"


def test_thresholds_are_the_tables_own():
    own = CheckThresholds(dead_warn=5, dead_error=10, backlog_warn=1, backlog_error=2)
    table_status = status(counts={"dead": 3, "pending": 1}, dead_by_code={"UNKNOWN": 3})
    assert check("dead_letters", table_status, own).severity == "ok"
    assert check("dead_letters", table_status).severity == "warn"
    assert check("backlog", table_status, own).severity == "warn"
    assert check("backlog", table_status).severity == "ok"
    assert check("backlog", table_status, own).metadata["backlog_warn"] == 1
