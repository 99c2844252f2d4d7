"""Quiet history (issue 43, item 4): maintenance that finds nothing leaves no run, and a group run's tags are
not a wall on the Runs page. Real PostgreSQL; the schedules evaluated as Dagster's daemon evaluates them."""

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.defs.relay import hosted_tag
from outbox_pipelines.defs.resources import OutboxDatabase
from outbox_pipelines_tests.defs.conftest import op_metadata, run_job
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.rows import make_dead, make_sent, make_stuck

DAY_START = datetime(2026, 3, 2, tzinfo=UTC)


@pytest.fixture
def instance(persistent_instance):
    """What is evaluated here (schedules, sensors) refers to its instance: one on disk."""
    return persistent_instance


def _definitions(resources: dict) -> dg.Definitions:
    from outbox_pipelines.definitions import build_definitions

    return build_definitions(resources)


def _evaluate(schedule: dg.ScheduleDefinition, context: dg.ScheduleEvaluationContext) -> dg.RunRequest | str:
    data = schedule.evaluate_tick(context)
    if data.run_requests:
        assert len(data.run_requests) == 1, data.run_requests
        return data.run_requests[0]
    assert data.skip_message, data
    return data.skip_message


def _tick(resources: dict, instance, name: str) -> dg.RunRequest | str:
    """One tick of schedule ``name``: its run request, or the reason it skipped."""
    schedule = _definitions(resources).resolve_schedule_def(name)
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=DAY_START, resources={"outbox_db": resources["outbox_db"]}
    ) as context:
        return _evaluate(schedule, context)


def _ticks_in_a_day(cron: str) -> list[datetime]:
    from dagster._utils.schedules import cron_string_iterator

    ticks = []
    for tick in cron_string_iterator(DAY_START.timestamp(), cron, "UTC"):
        if tick >= DAY_START + timedelta(days=1):
            return ticks
        ticks.append(tick)
    raise AssertionError("unreachable")


def test_an_idle_day_leaves_the_relay_runs_one_clean_and_one_prune_not_313_maintenance_runs(
    db_url, instance, resources
):
    """Every tick of a day at the default cadences, on an idle outbox: requeue (every 5 min) and the cleaner
    (hourly) skip with a reason; the cleaner's once-a-day pass over the wings' shared tables is its one run."""
    defs = _definitions(resources)
    runs: dict[str, int] = {}
    reasons: set[str] = set()
    for schedule in defs.schedules:
        ticks = _ticks_in_a_day(schedule.cron_schedule)
        if schedule.name not in ("requeue_stuck_every_5_minutes", "clean_hourly"):
            runs[schedule.name] = len(ticks)  # a plain schedule: a run every tick
            continue
        runs[schedule.name] = 0
        # One context for the day's ticks (a context builds its own instance: a second each); what a tick decides
        # does not depend on its time, only on the database and on the runs so far.
        with dg.build_schedule_context(
            instance=instance, scheduled_execution_time=DAY_START, resources={"outbox_db": OutboxDatabase(url=db_url)}
        ) as context:
            for _ in ticks:
                outcome = _evaluate(schedule, context)
                if isinstance(outcome, str):
                    reasons.add(outcome)
                    continue
                runs[schedule.name] += 1
                result = run_job(
                    schedule.job.name, resources, instance, outcome.run_config or None, tags=dict(outcome.tags)
                )
                assert result.success
    assert runs == {
        "relay_group_default_every_30_minutes": 48,
        "requeue_stuck_every_5_minutes": 0,
        "clean_hourly": 1,
        "prune_run_history_daily": 1,
    }, runs
    assert sum(runs.values()) == 50  # it was 361: 288 requeue runs and 24 cleaner runs that found nothing
    assert reasons == {
        "nothing stuck: no row past its lease or the stuck threshold, no key left waiting",
        "nothing past its retention: no sent, dead or audit row to delete",
    }, reasons


def test_a_stuck_row_launches_requeue_for_its_table_only_and_then_the_ticks_skip_again(
    db_url, conn, instance, resources
):
    ids = enqueue_n(conn, "outbox_events", 3)
    make_stuck(conn, "outbox_events", ids[:2])  # its relay died: the lease ended a minute ago
    make_stuck(conn, "outbox_memory", enqueue_n(conn, "outbox_memory", 1), lease_left=timedelta(minutes=5))
    request = _tick(resources, instance, "requeue_stuck_every_5_minutes")
    assert isinstance(request, dg.RunRequest), request
    assert request.run_config == {"ops": {"requeue_stuck_op": {"config": {"tables": ["outbox_events"]}}}}
    result = run_job("requeue_stuck_job", resources, instance, request.run_config, tags=dict(request.tags))
    assert result.success and op_metadata(result, "requeue_stuck_op")["requeued_total"] == 2
    assert statuses(conn, "outbox_events") == {"pending": 3}
    skipped = _tick(resources, instance, "requeue_stuck_every_5_minutes")
    assert skipped == "nothing stuck: no row past its lease or the stuck threshold, no key left waiting"


def test_an_ordering_key_left_waiting_is_work_for_requeue(db_url, conn, instance, resources):
    outbox = Outbox("outbox_events")
    head, behind = (
        outbox.enqueue(conn, Message(topic="t", payload={"n": n}, ordering_key="org-7"), outside_transaction=True).id
        for n in range(2)
    )
    assert _tick(resources, instance, "requeue_stuck_every_5_minutes").startswith("nothing stuck")  # waits its head
    make_sent(conn, "outbox_events", head)  # settled without releasing its key: the one behind waits for nothing
    request = _tick(resources, instance, "requeue_stuck_every_5_minutes")
    assert isinstance(request, dg.RunRequest), request
    result = run_job("requeue_stuck_job", resources, instance, request.run_config)
    assert result.success
    blocked = conn.execute("SELECT ordering_blocked FROM outbox_events WHERE id = %s", (behind,)).fetchone()
    assert blocked == {"ordering_blocked": False}
    assert _tick(resources, instance, "requeue_stuck_every_5_minutes").startswith("nothing stuck")


def test_a_requeue_run_still_active_is_not_doubled(db_url, conn, instance, resources):
    make_stuck(conn, "outbox_events", enqueue_n(conn, "outbox_events", 1))
    job = _definitions(resources).resolve_job_def("requeue_stuck_job")
    started = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED)
    assert _tick(resources, instance, "requeue_stuck_every_5_minutes") == (
        f"requeue_stuck_job run {started.run_id[:8]} is still active"
    )


def test_rows_past_their_retention_launch_the_cleaner_and_a_clean_outbox_skips(db_url, conn, instance, resources):
    run_job("clean_job", resources, instance)  # today's pass over the shared tables is done
    ids = enqueue_n(conn, "outbox_events", 3)
    make_sent(conn, "outbox_events", ids[0], age=timedelta(hours=1))  # within the retention (168 h)
    make_dead(conn, "outbox_events", ids[1], at=datetime.now(UTC) - timedelta(days=1))  # within 30 days
    assert _tick(resources, instance, "clean_hourly") == (
        "nothing past its retention: no sent, dead or audit row to delete"
    )
    make_sent(conn, "outbox_memory", enqueue_n(conn, "outbox_memory", 1), age=timedelta(days=8))
    request = _tick(resources, instance, "clean_hourly")
    assert isinstance(request, dg.RunRequest) and request.tags["outbox/trigger"] == "retention", request
    result = run_job("clean_job", resources, instance)
    assert result.success and op_metadata(result, "clean_op")["deleted_sent_total"] == 1
    make_dead(conn, "outbox_events", ids[2], at=datetime.now(UTC) - timedelta(days=31))
    assert isinstance(_tick(resources, instance, "clean_hourly"), dg.RunRequest)


def test_a_group_run_hides_its_per_table_tags_and_the_runs_page_still_filters_by_them(
    db_url, conn, instance, resources
):
    enqueue_n(conn, "outbox_memory", 2)
    result = run_job(
        "relay_group_default_job", resources, instance, {"ops": {"relay_group": {"config": {"once": True}}}}
    )
    assert result.success
    tags = instance.get_run_by_id(result.run_id).tags
    shown = {key for key in tags if not key.startswith(".dagster/")}
    assert {key for key in shown if key.startswith("outbox/")} == {"outbox/group", "outbox/kind", "outbox/outcome"}
    assert tags[hosted_tag("outbox_memory")] == "hosted" and hosted_tag("outbox_memory").startswith(".dagster/")
    single = run_job(
        "relay_job", resources, instance, {"ops": {"relay_table": {"config": {"table": "outbox_memory", "once": True}}}}
    )
    assert single.success and instance.get_run_by_id(single.run_id).tags["outbox/table"] == "outbox_memory"
    # One filter finds every run that relayed the table, a group's or a single table's; another table's, none.
    relayed = instance.get_runs(filters=dg.RunsFilter(tags={hosted_tag("outbox_memory"): "hosted"}))
    assert {run.run_id for run in relayed} == {result.run_id, single.run_id}
    assert instance.get_runs(filters=dg.RunsFilter(tags={"outbox/table": "outbox_memory"}))[0].run_id == single.run_id
