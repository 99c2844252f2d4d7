"""Asset checks at pass / WARN / ERROR, the backlog sensor, and alerts reaching a local webhook."""

from datetime import timedelta

import dagster as dg
import pytest

from outbox_pipelines.core.oncall.health import CHECK_NAMES
from outbox_pipelines.defs.oncall_sensor import oncall_sensor
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import evaluate_run_failure_alert, run_job, run_relay_job_declaring
from outbox_pipelines_tests.helpers import enqueue_n
from outbox_pipelines_tests.rows import age_rows, make_dead, make_stuck
from outbox_pipelines_tests.scratch import DEMO_PARTS


def check_results(result) -> dict:
    found = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            data = event.event_specific_data
            if data.asset_key == dg.AssetKey(["outbox", "outbox_orders"]):
                metadata = {k: v.value for k, v in data.metadata.items()}
                found[data.check_name] = (data.passed, data.severity.value, metadata)
    return found


def test_checks_pass_on_a_healthy_table(db_url, conn, instance, resources):
    enqueue_n(conn, "outbox_orders", 3)
    conn.execute("UPDATE outbox_orders SET status = 'sent', published_at = created_at + interval '2 seconds'")
    result = run_job("outbox_checks_job", resources, instance)
    assert result.success
    checks = check_results(result)
    assert set(checks) == {"lag", "dead_letters", "stuck", "backlog", "destination", "relay", "blocked_keys", "vacuum"}
    assert all(passed for passed, _, _ in checks.values())
    assert checks["lag"][2]["lag_p95_s"] == pytest.approx(2.0)


def test_the_checks_job_runs_the_outbox_s_checks_and_not_the_team_s_own(db_url, conn, instance, resources):
    """The outbox's definitions merged into a team's code location: outbox_checks_job runs the outbox tables' and
    the schema's checks, never the team's own asset checks (one that fails here would fail the job)."""
    from outbox_pipelines.definitions import build_definitions

    @dg.asset
    def sales_summary() -> int:
        return 1

    @dg.asset_check(asset=sales_summary)
    def summary_positive() -> dg.AssetCheckResult:
        raise FileNotFoundError("the team's own data")

    team = dg.Definitions(assets=[sales_summary], asset_checks=[summary_positive])
    merged = dg.Definitions.merge(team, build_definitions(resources))
    result = merged.resolve_job_def("outbox_checks_job").execute_in_process(instance=instance, raise_on_error=False)
    assert result.success
    checked = {
        (event.event_specific_data.asset_key.to_user_string(), event.event_specific_data.check_name)
        for event in result.all_events
        if event.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    assert ("outbox/outbox_orders", "dead_letters") in checked and ("outbox_schema", "schema_drift") in checked
    assert not [key for key, _ in checked if not key.startswith("outbox")], checked


def test_a_declared_table_not_in_the_database_fails_its_relay_check_and_the_checks_run_completes(
    db_url, instance, tmp_path
):
    """Declared where `db upgrade` did not create it (a Python-declared table, an upgrade not run yet): its relay
    check fails saying what to run; the run's other checks are graded, and the run succeeds."""
    from outbox_pipelines.core.settings import load_settings
    from outbox_pipelines.defs.factory import build_from_settings

    config = tmp_path / "outbox.toml"
    config.write_text(DEMO_PARTS + '[tables.ghost_outbox]\ndestination = "paper"\n')
    definitions = build_from_settings(load_settings(path=config), outbox_resources(url=db_url, config_path=str(config)))
    job = definitions.resolve_job_def("outbox_checks_job")
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert result.success
    relay = next(
        event.event_specific_data
        for event in result.all_events
        if event.event_type_value == "ASSET_CHECK_EVALUATION"
        and event.event_specific_data.asset_key == dg.AssetKey(["outbox", "ghost_outbox"])
        and event.event_specific_data.check_name == "relay"
    )
    assert not relay.passed and relay.severity == dg.AssetCheckSeverity.ERROR
    assert "ghost_outbox' does not exist: run 'outbox-pipelines db upgrade'" in relay.description


def test_checks_warn_on_dead_letters_and_error_on_stuck_and_lag(db_url, conn, instance, resources):
    ids = enqueue_n(conn, "outbox_orders", 60)
    make_dead(conn, "outbox_orders", ids[:2], code="BAD_REQUEST")
    make_stuck(conn, "outbox_orders", ids[2:55])
    # Five messages created and due an hour ago, still pending (created_at alone would read as a replay: due now).
    age_rows(conn, "outbox_orders", ids[55:], created=timedelta(hours=1), available=timedelta(hours=1))
    checks = check_results(run_job("outbox_checks_job", resources, instance))
    assert checks["dead_letters"][:2] == (False, "WARN")
    assert checks["dead_letters"][2]["dead_BAD_REQUEST"] == 2
    assert checks["stuck"][:2] == (False, "ERROR") and checks["stuck"][2]["stuck"] == 53
    assert checks["lag"][:2] == (False, "ERROR")  # the oldest ready message has waited an hour since it was due
    lag = checks["lag"][2]
    assert lag["waiting_now"] == 58 and lag["lag_now_s"] == pytest.approx(3600, abs=60)
    assert lag["lag_now_p95_s"] >= 300  # 5 of 58 an hour late: the p95 is past its error threshold too
    assert checks["backlog"][0] is True


def test_thresholds_come_from_the_table_settings(db_url, conn, instance, tmp_path):
    config = tmp_path / "outbox.toml"
    config.write_text(DEMO_PARTS + "[tables.outbox_orders]\nbacklog_warn = 2\nbacklog_error = 5\n")
    enqueue_n(conn, "outbox_orders", 3)
    resources = outbox_resources(url=db_url, config_path=str(config))
    checks = check_results(run_job("outbox_checks_job", resources, instance))
    assert checks["backlog"][:2] == (False, "WARN")


def backlog_sensor_def():
    from outbox_pipelines.definitions import build_definitions

    return build_definitions().resolve_sensor_def("relay_group_default_on_backlog")


def test_backlog_sensor_requests_a_run_only_when_messages_are_ready(db_url, conn, instance):
    sensor = backlog_sensor_def()
    resources = {"outbox_db": outbox_resources(url=db_url)["outbox_db"]}
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = sensor.evaluate_tick(context)
    assert result.run_requests == [] and "no ready messages" in result.skip_message
    enqueue_n(conn, "outbox_orders", 1)
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = sensor.evaluate_tick(context)
    assert len(result.run_requests) == 1
    assert result.run_requests[0].job_name in (None, "relay_group_default_job")
    assert result.run_requests[0].tags["outbox/trigger"] == "backlog"


def test_backlog_sensor_skips_while_a_relay_run_is_active(db_url, conn, instance):
    enqueue_n(conn, "outbox_orders", 1)
    from outbox_pipelines.definitions import build_definitions

    job = build_definitions().resolve_job_def("relay_group_default_job")
    run = instance.create_run_for_job(job, tags=dict(job.tags))
    instance.handle_run_event(
        run.run_id, dg.DagsterEvent(event_type_value="PIPELINE_START", job_name=job.name, message="started")
    )
    resources = {"outbox_db": outbox_resources(url=db_url)["outbox_db"]}
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = backlog_sensor_def().evaluate_tick(context)
    assert result.run_requests == [] and "is active" in result.skip_message


def oncall_tick(instance, db_url, cursor=None):
    with dg.build_sensor_context(
        instance=instance, resources={"outbox_db": outbox_resources(url=db_url)["outbox_db"]}, cursor=cursor
    ) as context:
        return oncall_sensor(context)


def test_oncall_sensor_records_check_evaluations_and_alerts_once(db_url, conn, instance, http_sink, monkeypatch):
    monkeypatch.setenv("OUTBOX_ALERT_WEBHOOK_URL", http_sink.url)
    enqueue_n(conn, "outbox_orders", 1)
    make_dead(conn, "outbox_orders", code="UNAUTHORIZED")
    result = oncall_tick(instance, db_url)
    evaluations = {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.asset_events
        if isinstance(e, dg.AssetCheckEvaluation)
    }
    dead = evaluations[("outbox/outbox_orders", "dead_letters")]
    assert not dead.passed and dead.severity == dg.AssetCheckSeverity.WARN
    assert len(evaluations) == 4 * (len(CHECK_NAMES) + 1)  # every table, every check and the vacuum check
    [alert] = [r.body for r in http_sink.received]
    assert (alert["status"], alert["severity"], alert["table"], alert["check"]) == (
        "firing",
        "warning",
        "outbox_orders",
        "dead_letters",
    )
    assert "--error-code UNAUTHORIZED --dry-run" in alert["summary"]
    # the next tick: nothing new to say, and of the unchanged tables only one is recorded again, in turn
    again = oncall_tick(instance, db_url, cursor=result.cursor)
    assert len(http_sink.received) == 1 and len({e.asset_key for e in again.asset_events}) == 1


def test_run_failure_alert_reaches_the_webhook(db_url, instance, resources, http_sink, monkeypatch):
    from outbox_pipelines.defs.alerts import run_failure_alert

    monkeypatch.setenv("OUTBOX_ALERT_WEBHOOK_URL", http_sink.url)
    # A table the code location still offers that the settings no longer declare: the run fails.
    failed = run_relay_job_declaring(["missing"], resources, instance, {"ops": {"relay_table": {"config": {}}}})
    assert not failed.success
    with dg.build_run_status_sensor_context(
        sensor_name="outbox_run_failure_alert",
        dagster_instance=instance,
        dagster_run=failed.dagster_run,
        dagster_event=failed.get_run_failure_event(),
        resources={"outbox_db": resources["outbox_db"]},
    ) as context:
        run_failure_alert(context.for_run_failure())
    [alert] = [r.body for r in http_sink.received]
    assert alert["kind"] == "run_failure" and alert["job"] == "relay_job"
    assert alert["run_id"] == failed.run_id and alert["link"].endswith(f"/runs/{failed.run_id}")
    # the root cause, not Dagster's "Steps failed"
    assert "no settings for table 'missing'" in alert["summary"], alert["summary"]
    assert "Steps failed" not in alert["text"] and ".dagster/" not in str(alert)


def test_a_run_interrupted_by_a_stop_is_marked_canceled_and_not_alerted(instance, resources, http_sink, monkeypatch):
    """A run the daemon launched while `dev` was stopping is interrupted before its relay starts: that is a
    stop, shown as CANCELED like any other run a stop ends, never a failure alert."""
    from outbox_pipelines.defs.alerts import run_failure_alert

    @dg.op
    def starting() -> None:
        raise dg.DagsterExecutionInterruptedError()

    @dg.job
    def interrupted_job() -> None:
        starting()

    monkeypatch.setenv("OUTBOX_ALERT_WEBHOOK_URL", http_sink.url)
    failed = interrupted_job.execute_in_process(instance=instance, raise_on_error=False)
    assert instance.get_run_by_id(failed.run_id).status == dg.DagsterRunStatus.FAILURE
    with dg.build_run_status_sensor_context(
        sensor_name="outbox_run_failure_alert",
        dagster_instance=instance,
        dagster_run=failed.dagster_run,
        dagster_event=failed.get_run_failure_event(),
        resources={"outbox_db": resources["outbox_db"]},
    ) as context:
        run_failure_alert(context.for_run_failure())
    run = instance.get_run_by_id(failed.run_id)
    assert run.status == dg.DagsterRunStatus.CANCELED
    assert run.tags["outbox/failure"] == "interrupted_by_stop"
    assert http_sink.received == []


def test_alerts_only_log_without_a_webhook(monkeypatch, caplog):
    from outbox_pipelines.core.oncall.alerts import post_alert

    monkeypatch.delenv("OUTBOX_ALERT_WEBHOOK_URL", raising=False)
    assert post_alert({"summary": "something"}) is False
    assert "something" in caplog.text


def test_a_failed_relay_run_whose_relay_died_is_told_once_as_relay_died(
    db_url, conn, instance, resources, http_sink, monkeypatch
):
    """Dagster may mark a SIGKILLed relay run failed before its heartbeat goes silent: one alert, rows back now."""
    import subprocess

    from outbox_pipelines.core.relay import liveness

    monkeypatch.setenv("OUTBOX_ALERT_WEBHOOK_URL", http_sink.url)
    failed = run_relay_job_declaring(["missing"], resources, instance, {"ops": {"relay_table": {"config": {}}}})
    gone = subprocess.Popen(["true"])
    gone.wait()
    [row_id] = enqueue_n(conn, "outbox_orders", 1)
    make_stuck(conn, "outbox_orders", worker="dagster:dead", lease_left=timedelta(minutes=1))
    conn.execute(
        "INSERT INTO outbox_relay_workers (worker, table_name, run_id, pid, host) VALUES (%s, %s, %s, %s, %s)",
        ("dagster:dead", "outbox_orders", failed.run_id, gone.pid, liveness.HOST),
    )
    instance.add_run_tags(failed.run_id, {"outbox/table": "outbox_orders"})
    evaluate_run_failure_alert(instance, resources, failed)  # twice (two sensors, a retried tick): one alert
    [alert] = [r.body for r in http_sink.received]
    assert (alert["kind"], alert["table"], alert["figures"]["held"], alert["figures"]["returned"]) == (
        "relay_died",
        "outbox_orders",
        1,
        1,
    )
    assert conn.execute("SELECT status FROM outbox_orders WHERE id = %s", (row_id,)).fetchone()["status"] == "pending"
    assert instance.get_run_by_id(failed.run_id).tags["outbox/failure"] == "relay_died"
