"""Issue 25 (item 4): an operator's typo in a launch is refused naming the field and how to write it, never as
pydantic's dump, and never pages as [error]; a real failure still does.

Each mistake runs its job in-process against a real PostgreSQL, then ``outbox_run_failure_alert`` evaluates
the failed run and posts to a local webhook: a refused launch is one note at severity ``info``.
"""

import re
from datetime import timedelta

import dagster as dg
import pytest

from outbox_pipelines.defs.common import REFUSED_INPUT, RefusedLaunch, refused_config_text
from outbox_pipelines.defs.replay import ReplayConfig
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import evaluate_run_failure_alert, run_job, run_relay_job_declaring
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.rows import make_dead, make_sent

ORDERS = "outbox_orders"
UNREACHABLE = "postgresql://nobody@127.0.0.1:9/none"
PYDANTIC_DUMP = ("validation error", "pydantic", "[type=", "errors.pydantic.dev")


def _op_config(op: str, **values) -> dict:
    return {"ops": {op: {"config": values}}}


def _step_failure(result) -> dg.DagsterEvent:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "expected the step to fail"
    return failures[0]


def _refusal(result) -> tuple[str, str]:
    """(what the operator reads on the run, the field the failure names) of a refused launch."""
    assert not result.success
    data = _step_failure(result).event_specific_data
    shown = f"{data.error.message}\n{data.user_failure_data.description if data.user_failure_data else ''}"
    for dump in PYDANTIC_DUMP:
        assert dump not in shown and dump not in "".join(data.error.stack), (dump, shown)
    assert data.user_failure_data is not None, shown
    return data.user_failure_data.description, data.user_failure_data.metadata[REFUSED_INPUT].value


def _alert(instance, resources, result, http_sink, monkeypatch, evaluations: int = 2) -> dict:
    """What outbox_run_failure_alert posts for the run (a refused launch evaluated twice: still one note)."""
    monkeypatch.setenv("OUTBOX_ALERT_WEBHOOK_URL", http_sink.url)
    evaluate_run_failure_alert(instance, resources, result, times=evaluations)
    [alert] = [r.body for r in http_sink.received]
    return alert


def _assert_a_note(alert: dict, field: str, instance, result) -> None:
    assert alert["severity"] == "info" and alert["kind"] == "run_failure", alert
    assert "[error]" not in alert["text"] and alert["text"].startswith("*NOTE* [info]"), alert["text"]
    assert alert["figures"]["refused_input"] == field
    assert "launch refused" in alert["summary"] and "nothing to do on call" in alert["summary"]
    for dump in PYDANTIC_DUMP:
        assert dump not in alert["text"], alert["text"]
    assert instance.get_run_by_id(result.run_id).tags["outbox/failure"] == "refused_launch"


@pytest.fixture
def dead_orders(conn):
    ids = enqueue_n(conn, ORDERS, 2, prefix="ord-", topic="order.created")
    make_dead(conn, ORDERS, code="BROKER_5XX")
    return ids


# -- replay_dead_job -----------------------------------------------------------------------------------------


def test_replay_without_a_filter_is_refused_naming_the_filters_and_all(
    conn, instance, resources, dead_orders, http_sink, monkeypatch
):
    result = run_job("replay_dead_job", resources, instance, _op_config("replay_dead_op", table=ORDERS, dry_run=False))
    message, field = _refusal(result)
    assert field == "filter"
    assert message == (
        "replay needs a filter: set ids, topic, tenant_id, error_code, since or until (--id, --topic, --tenant, "
        "--error-code, --since, --until), or set all: true (--all) to replay every dead row of the table. "
        "Nothing was touched."
    )
    assert statuses(conn, ORDERS) == {"dead": 2}
    _assert_a_note(_alert(instance, resources, result, http_sink, monkeypatch), "filter", instance, result)


@pytest.mark.parametrize("field", ["since", "until"])
def test_replay_since_yesterday_is_refused_before_the_database_without_pydantic(
    instance, http_sink, monkeypatch, field
):
    resources = outbox_resources(url=UNREACHABLE)  # refused on the config: the database is never needed
    config = _op_config("replay_dead_op", table=ORDERS, **{field: "yesterday"})
    result = run_job("replay_dead_job", resources, instance, config)
    message, named = _refusal(result)
    assert named == field
    assert message == (
        f'{field}="yesterday" is not a time: use ISO 8601 like 2026-11-21T10:00:00Z, a date like '
        "2026-11-21, or a time ago like 30m, 2h, 7d"
    )
    assert "cannot connect" not in message
    _assert_a_note(_alert(instance, resources, result, http_sink, monkeypatch), field, instance, result)


@pytest.mark.parametrize(("job", "op"), [("replay_dead_job", "replay_dead_op"), ("skip_dead_job", "skip_dead_op")])
def test_a_table_typo_is_refused_by_dagster_before_any_run(conn, instance, resources, dead_orders, job, op):
    """The table is one of the code location's (a Dagster Enum, issue 43): a typo starts no run and pages no one
    (tests/defs/test_launchpads.py asks the launchpad's GraphQL the same)."""
    config = _op_config(op, table="outbox_order", ids=dead_orders, dry_run=False)
    with pytest.raises(dg.DagsterInvalidConfigError, match="config:table not in enum type OutboxTableName"):
        run_job(job, resources, instance, config)
    assert instance.get_runs() == []
    assert statuses(conn, ORDERS) == {"dead": 2}


def test_a_table_the_settings_do_not_know_is_still_a_refused_launch(
    conn, tmp_path, db_url, instance, dead_orders, http_sink, monkeypatch
):
    """A run whose settings (the resource's) lack a table the code location offers: refused naming the field."""
    from outbox_pipelines_tests.scratch import DEMO_PARTS

    config_path = tmp_path / "outbox.toml"
    config_path.write_text(DEMO_PARTS.replace('"orders", ', "").replace(', "orders"', ""))
    resources = outbox_resources(url=db_url, config_path=str(config_path))
    result = run_job("replay_dead_job", resources, instance, _op_config("replay_dead_op", table=ORDERS, all=True))
    message, field = _refusal(result)
    assert field == "table" and message.startswith("table: no settings for table 'outbox_orders'"), message
    assert statuses(conn, ORDERS) == {"dead": 2}
    _assert_a_note(_alert(instance, resources, result, http_sink, monkeypatch), "table", instance, result)


def test_replay_with_an_unknown_error_code_is_refused_naming_error_code(conn, instance, resources, dead_orders):
    result = run_job(
        "replay_dead_job",
        resources,
        instance,
        _op_config("replay_dead_op", table=ORDERS, error_code="BROKER_500", dry_run=False),
    )
    message, field = _refusal(result)
    assert field == "error_code"
    assert message.startswith("error_code: error code 'BROKER_500' is unknown: known codes are BAD_REQUEST, ")
    assert statuses(conn, ORDERS) == {"dead": 2}


def test_a_replay_config_built_in_code_refuses_with_the_same_sentence():
    with pytest.raises(RefusedLaunch) as refused:
        ReplayConfig(since="yesterday", ids=[2**64])
    assert isinstance(refused.value, ValueError)  # as pydantic's error was, for callers that catch it
    assert refused.value.field == "ids"
    assert str(refused.value) == (
        f'ids={2**64} does not fit a row id (bigint, at most {2**63 - 1}); since="yesterday" is not a time: '
        "use ISO 8601 like 2026-11-21T10:00:00Z, a date like 2026-11-21, or a time ago like 30m, 2h, 7d"
    )


# -- backfill_job --------------------------------------------------------------------------------------------


def test_backfill_without_a_partition_is_refused_naming_the_partition(instance, http_sink, monkeypatch):
    resources = outbox_resources(url=UNREACHABLE)
    result = run_job("backfill_job", resources, instance, _op_config("backfill_op", table=ORDERS))
    message, field = _refusal(result)
    assert field == "partition"
    assert re.fullmatch(
        r"partition: backfill_job re-delivers one day's sent messages and no day was chosen; pick a day from "
        r"2026-01-01 to \d{4}-\d\d-\d\d written YYYY-MM-DD, e\.g\. \d{4}-\d\d-\d\d, in the launchpad's partition "
        r"selector or as the tag dagster/partition",
        message,
    ), message
    _assert_a_note(_alert(instance, resources, result, http_sink, monkeypatch), "partition", instance, result)


@pytest.mark.parametrize("key", ["yesterday", "2025-12-31", "2026-13-01"])
def test_backfill_with_a_bad_partition_key_is_refused_with_the_days_it_takes(instance, http_sink, monkeypatch, key):
    # The launchpad only offers real days; a launch through the API or the CLI can tag any text.
    resources = outbox_resources(url=UNREACHABLE)
    config = _op_config("backfill_op", table=ORDERS)
    result = run_job("backfill_job", resources, instance, config, tags={"dagster/partition": key})
    message, field = _refusal(result)
    assert field == "partition"
    assert message.startswith(f"partition: {key!r} is not a day backfill_job knows; pick a day from 2026-01-01 to ")
    assert "ValueError" not in message and "does not match format" not in message
    _assert_a_note(_alert(instance, resources, result, http_sink, monkeypatch), "partition", instance, result)


@pytest.mark.parametrize(
    ("values", "field", "expected"),
    [
        ({"batch_size": 0}, "batch_size", "batch_size: Input should be greater than or equal to 1 (got 0)"),
        ({"reason": "fine\nforged"}, "reason", "reason contains a control character (U+000A) at position 4"),
    ],
)
def test_backfill_config_mistakes_are_refused_naming_the_field(db_url, instance, resources, values, field, expected):
    config = _op_config("backfill_op", table=ORDERS, dry_run=False, **values)
    result = run_job("backfill_job", resources, instance, config, partition_key="2026-11-01")
    message, named = _refusal(result)
    assert named == field and message.startswith(expected), message


# -- skip_dead_job -------------------------------------------------------------------------------------------


def test_skip_naming_no_message_is_refused_naming_ids(instance):
    resources = outbox_resources(url=UNREACHABLE)
    result = run_job("skip_dead_job", resources, instance, _op_config("skip_dead_op", table="outbox_events"))
    message, field = _refusal(result)
    assert field == "ids"
    assert message.startswith(
        "ids: a skip names the dead messages to pass over: their ids (--id, repeatable; ids "
        "in skip_dead_job) or their ordering key (--key; ordering_key). Nothing was touched"
    )


def test_skip_with_an_id_that_is_not_one_is_refused_by_its_config(instance):
    resources = outbox_resources(url=UNREACHABLE)
    result = run_job(
        "skip_dead_job", resources, instance, _op_config("skip_dead_op", table="outbox_events", ids=[2**64])
    )
    message, field = _refusal(result)
    assert (field, message) == ("ids", f"ids={2**64} does not fit a row id (bigint, at most {2**63 - 1})")


# -- any job ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "op", "values"),
    [("relay_job", "relay_table", {"table": "outbox_ordres"}), ("clean_job", "clean_op", {"tables": ["outbox_ordrs"]})],
)
def test_a_table_typo_in_relay_job_or_clean_job_starts_no_run(conn, instance, resources, job, op, values):
    """The tables are the code location's (a Dagster Enum): Dagster refuses the launch before any run exists."""
    enqueue_n(conn, ORDERS, 1)
    make_sent(conn, ORDERS, age=timedelta(days=30))
    with pytest.raises(dg.DagsterInvalidConfigError, match=r"not in enum type OutboxTableName got outbox_ord"):
        run_job(job, resources, instance, _op_config(op, **values))
    assert instance.get_runs() == [] and statuses(conn, ORDERS) == {"sent": 1}


def test_a_relay_job_table_gone_from_the_settings_is_a_refused_launch_too(
    conn, instance, resources, http_sink, monkeypatch
):
    """A table the code location still offers (loaded before it was removed from outbox.toml): refused, with
    the tables that exist now."""
    enqueue_n(conn, ORDERS, 1)
    config = _op_config("relay_table", table="outbox_ordres")
    result = run_relay_job_declaring(["outbox_ordres", ORDERS], resources, instance, config)
    message, field = _refusal(result)
    assert field == "table" and message.startswith("table: no settings for table 'outbox_ordres'")
    _assert_a_note(_alert(instance, resources, result, http_sink, monkeypatch), "table", instance, result)
    assert statuses(conn, ORDERS) == {"pending": 1}


def test_a_pydantic_refusal_of_a_config_that_is_not_a_launch_config_is_told_plainly(
    instance, resources, http_sink, monkeypatch
):
    """A config class written without LaunchConfig: the run shows pydantic's error, but on-call never does."""
    from pydantic import Field

    class PlainConfig(dg.Config):
        limit: int = Field(default=1, ge=1)

    @dg.op
    def limited(config: PlainConfig) -> None:
        raise AssertionError("never reached")

    @dg.job
    def plain_job() -> None:
        limited()

    result = plain_job.execute_in_process(
        instance=instance, raise_on_error=False, run_config=_op_config("limited", limit=0)
    )
    assert not result.success
    alert = _alert(instance, resources, result, http_sink, monkeypatch)
    _assert_a_note(alert, "limit", instance, result)
    assert "limit: Input should be greater than or equal to 1" in alert["summary"]


def test_refused_config_text_reads_a_pydantic_dump():
    dump = (
        "pydantic_core._pydantic_core.ValidationError: 2 validation errors for ReplayConfig\nsince\n"
        "  Value error, since=\"yesterday\" is not a time: use ISO 8601 [type=value_error, input_value='yesterday',"
        " input_type=str]\n    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
        "batch_size\n  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, "
        "input_type=int]\n"
    )
    assert refused_config_text(dump) == (
        "since",
        'since="yesterday" is not a time: use ISO 8601; batch_size: Input should be greater than or equal to 1',
    )
    assert refused_config_text("RuntimeError: boom") is None


# -- real failures still page ---------------------------------------------------------------------------------


def test_a_replay_with_the_database_unreachable_still_pages_as_error(instance, http_sink, monkeypatch):
    resources = outbox_resources(url=UNREACHABLE)
    result = run_job("replay_dead_job", resources, instance, _op_config("replay_dead_op", table=ORDERS, all=True))
    assert not result.success
    alert = _alert(instance, resources, result, http_sink, monkeypatch, evaluations=1)
    assert (alert["severity"], alert["kind"], alert["job"]) == ("error", "run_failure", "replay_dead_job")
    assert alert["text"].startswith("*FIRING* [error] replay_dead_job failed"), alert["text"]
    assert "refused_input" not in alert["figures"]
    assert "outbox/failure" not in instance.get_run_by_id(result.run_id).tags


def test_an_op_that_crashes_still_pages_as_error(instance, resources, http_sink, monkeypatch):
    @dg.op
    def crashing() -> None:
        raise RuntimeError("the disk is full")

    @dg.job
    def crashing_job() -> None:
        crashing()

    result = crashing_job.execute_in_process(instance=instance, raise_on_error=False)
    alert = _alert(instance, resources, result, http_sink, monkeypatch, evaluations=1)
    assert alert["severity"] == "error" and "[error]" in alert["text"]
    assert "RuntimeError: the disk is full" in alert["summary"]


def test_a_backfill_launch_cannot_choose_where_messages_go(db_url, instance, resources):
    """Where messages go is the deployment's (the table's destination), never a launchpad's: the field is
    not in the job's config, so Dagster refuses the launch before any run exists."""
    with pytest.raises(dg.DagsterInvalidConfigError, match="destination_url"):
        run_job(
            "backfill_job",
            resources,
            instance,
            _op_config("backfill_op", table=ORDERS, destination_url="https://elsewhere"),
            partition_key="2026-11-01",
        )


# -- clean_job and the relay group jobs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field", "expected"),
    [
        ({"retention": "a week"}, "retention", "retention: cannot read duration 'a week'"),
        ({"audit_retention": "forever"}, "audit_retention", "audit_retention: cannot read duration 'forever'"),
        ({"retention": "1s", "tables": ["outbox_orders"]}, "retention", "retention: outbox_orders: a retention of "),
    ],
)
def test_clean_launch_mistakes_are_refused_naming_the_field_and_delete_nothing(
    db_url, conn, instance, resources, values, field, expected
):
    enqueue_n(conn, "outbox_orders", 2, prefix="kept-")
    make_sent(conn, ORDERS, age=timedelta(days=3))
    result = run_job("clean_job", resources, instance, _op_config("clean_op", **values))
    message, named = _refusal(result)
    assert named == field and message.startswith(expected), message
    assert conn.execute("SELECT count(*) AS n FROM outbox_orders").fetchone()["n"] == 2


def test_a_relay_group_launch_naming_no_group_is_refused(db_url, instance, resources):
    config = {"ops": {"relay_group": {"config": {"group": "defualt", "max_seconds": 1.0}}}}
    result = run_job("relay_group_default_job", resources, instance, config)
    message, named = _refusal(result)
    assert named == "group" and message.startswith("group: no relay group 'defualt'; groups: default"), message


def test_two_code_locations_in_one_process_each_take_their_own_tables():
    """Dagster keeps one config shape per field hash in a process, and an Enum's hash is its name: the ``tables`` of
    a code location built second (a team's tests, a reload) validated against the first one's tables."""
    from outbox_pipelines.defs.maintenance import TablesConfig, tables_schema

    def job_of(tables: list[str]) -> dg.JobDefinition:
        @dg.op(name="requeue_op", config_schema=tables_schema(TablesConfig, tables))
        def requeue_op() -> None:
            pass

        @dg.job(name="requeue")
        def requeue() -> None:
            requeue_op()

        return requeue

    first, second = job_of(["outbox_events"]), job_of(["outbox_events", "outbox_memory"])
    memory_only = {"ops": {"requeue_op": {"config": {"tables": ["outbox_memory"]}}}}
    assert second.execute_in_process(run_config=memory_only).success
    with pytest.raises(dg.DagsterInvalidConfigError, match="not in enum type OutboxTableName got outbox_memory"):
        first.execute_in_process(run_config=memory_only)
