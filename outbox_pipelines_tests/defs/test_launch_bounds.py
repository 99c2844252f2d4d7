"""A launch whose values are out of bounds is refused naming the field, before the database (issue 42, point 6):
a time ago of 99999999 days (OverflowError before), a backfill batch of 2**70 (bigint out of range before), a
skip reason holding a terminal escape (stored raw before), a retention of 99999999 days. The bounds are the
command line's too (core/settings/values.py): one rule for both."""

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import run_job
from outbox_pipelines_tests.defs.test_launch_mistakes import UNREACHABLE, _op_config, _refusal
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.rows import make_dead


def dead_keyed_row(conn) -> int:
    """A dead message that parks its ordering key: what skip passes over."""
    message = Message(topic="org.changed", payload={"org_id": 1}, ordering_key="k-1")
    Outbox("outbox_events").enqueue(conn, message, outside_transaction=True)
    make_dead(conn, "outbox_events")
    return conn.execute("SELECT id FROM outbox_events").fetchone()["id"]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("since", "99999999d", 'since="99999999d" is further back than 36500d (100 years)'),
        ("until", "99999999d", 'until="99999999d" is further back than 36500d (100 years)'),
        ("since", "1" + "0" * 400 + "w", "is further back than 36500d (100 years)"),
        ("until", "9999-12-31T23:00-05:00", 'until="9999-12-31T23:00-05:00" is not a time'),
    ],
)
def test_a_replay_time_out_of_bounds_is_refused_before_the_database(instance, field, value, said):
    resources = outbox_resources(url=UNREACHABLE)  # refused on the config: the database is never needed
    config = _op_config("replay_dead_op", table="outbox_orders", **{field: value})
    result = run_job("replay_dead_job", resources, instance, config)
    message, named = _refusal(result)
    assert named == field and said in message, message
    assert "OverflowError" not in message and "cannot connect" not in message


def test_a_backfill_batch_that_fits_no_integer_is_refused(instance, resources):
    result = run_job(
        "backfill_job",
        resources,
        instance,
        _op_config("backfill_op", table="outbox_orders", batch_size=2**70, dry_run=False),
        partition_key="2026-11-01",
    )
    message, named = _refusal(result)
    assert named == "batch_size", message
    assert message.startswith("batch_size: Input should be less than or equal to 2147483647"), message
    assert "out of range" not in message


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("\x1b[2J\x1b[31mreplayed by alice", "a control character (U+001B) at position 0"),
        ("fine\nworker = dagster:deadbeef", "a control character (U+000A) at position 4"),
        ("x" * 1001, "holds 1001 characters; at most 1000 are kept"),
    ],
)
def test_a_skip_reason_that_is_not_one_printable_line_is_refused(conn, instance, resources, reason, said):
    config = _op_config("skip_dead_op", table="outbox_events", ids=[dead_keyed_row(conn)], reason=reason, dry_run=False)
    result = run_job("skip_dead_job", resources, instance, config)
    message, named = _refusal(result)
    assert named == "reason" and said in message, message
    assert statuses(conn, "outbox_events") == {"dead": 1}
    skips = conn.execute("SELECT count(*) AS n FROM outbox_audit WHERE code = 'outbox_skip'").fetchone()["n"]
    assert skips == 0


def test_a_skip_reason_of_one_printable_line_is_kept_as_written(conn, instance, resources):
    reason = "poison message: ticket ÜBER-42 ✓"
    config = _op_config("skip_dead_op", table="outbox_events", ids=[dead_keyed_row(conn)], reason=reason, dry_run=False)
    assert run_job("skip_dead_job", resources, instance, config).success
    audit = conn.execute("SELECT * FROM outbox_audit WHERE code = 'outbox_skip'").fetchall()
    assert len(audit) == 1 and f"({reason})" in audit[0]["detail"], audit


def test_a_clean_retention_past_100_years_is_refused(instance):
    resources = outbox_resources(url=UNREACHABLE)
    result = run_job("clean_job", resources, instance, _op_config("clean_op", retention="99999999d"))
    message, named = _refusal(result)
    assert named == "retention" and "longer than 36500d (100 years)" in message, message


@pytest.mark.parametrize("max_seconds", [float("nan"), float("inf"), -1.0, 1e300])
@pytest.mark.parametrize(
    ("job", "op", "values"),
    [("relay_job", "relay_table", {"table": "outbox_events"}), ("relay_group_default_job", "relay_group", {})],
)
def test_a_relay_budget_that_would_never_end_is_refused(instance, job, op, values, max_seconds):
    resources = outbox_resources(url=UNREACHABLE)
    result = run_job(job, resources, instance, _op_config(op, max_seconds=max_seconds, **values))
    message, named = _refusal(result)
    assert named == "max_seconds", message
