"""replay_dead_job as an operator runs it from the launchpad: described config, listed rows, echoed filter,
a dry-run tag, and refusals that fail fast and touch nothing."""

import pytest

from outbox_pipelines.defs.replay import DRY_RUN_TAG, ReplayConfig
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import op_metadata, run_job
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.rows import make_dead

ORDERS = "outbox_orders"


def _config(**values) -> dict:
    return {"ops": {"replay_dead_op": {"config": {"table": ORDERS, **values}}}}


def _failure(result) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "expected the step to fail"
    error = failures[0].event_specific_data.error
    return error.message


def _snapshot(conn):
    return conn.execute(
        f"SELECT id, status, attempts, last_error_code, updated_at FROM {ORDERS} ORDER BY id"
    ).fetchall()


@pytest.fixture
def dead_orders(conn):
    ids = enqueue_n(conn, ORDERS, 3, prefix="ord-", topic="order.created")
    make_dead(conn, ORDERS, ids[:2], code="BROKER_5XX")
    make_dead(conn, ORDERS, ids[2], code="BAD_REQUEST")
    return ids


def test_every_config_field_has_a_description_in_the_launchpad(resources):
    from outbox_pipelines.definitions import build_definitions

    job = build_definitions(resources).resolve_job_def("replay_dead_job")
    op_config = (
        job.run_config_schema.config_type.fields["ops"]
        .config_type.fields["replay_dead_op"]
        .config_type.fields["config"]
        .config_type
    )
    assert set(op_config.fields) == set(ReplayConfig.model_fields)
    for name, field in op_config.fields.items():
        assert field.description and len(field.description) > 20, name
    for name in ("since", "until"):
        text = op_config.fields[name].description
        assert "updated_at" in text and "2026-11-21T10:00:00Z" in text and "2h" in text
    assert "all: true" in op_config.fields["all"].description


def test_dry_run_lists_rows_echoes_the_filter_and_is_tagged(conn, instance, resources, dead_orders):
    before = _snapshot(conn)
    result = run_job("replay_dead_job", resources, instance, _config(error_code="broker_5xx"))
    assert result.success
    meta = op_metadata(result, "replay_dead_op")
    assert meta["filter"] == "error_code=BROKER_5XX"
    assert (meta["dry_run"], meta["matched"], meta["would_replay"], meta["replayed"]) == (True, 2, 2, 0)
    assert meta["replayed_ids"] == dead_orders[:2]
    table = meta["rows"]
    assert "Would replay 2" in table and "filter: error_code=BROKER_5XX" in table
    assert "| id | event_id | topic | error code | died at |" in table
    for i, row_id in enumerate(dead_orders[:2]):
        assert f"| {row_id} | ord-{i} | order.created | BROKER_5XX | " in table
    assert "ord-2" not in table
    assert instance.get_run_by_id(result.run_id).tags[DRY_RUN_TAG] == "true"
    assert _snapshot(conn) == before


def test_real_run_lists_what_moved_and_is_tagged_false(conn, instance, resources, dead_orders):
    result = run_job("replay_dead_job", resources, instance, _config(all=True, dry_run=False))
    assert result.success
    meta = op_metadata(result, "replay_dead_op")
    assert meta["filter"] == "all dead rows (no filter)"
    assert (meta["matched"], meta["replayed"], meta["refused_bad_request"]) == (3, 2, 1)
    assert "Replayed 2" in meta["rows"] and f"| {dead_orders[0]} | ord-0 |" in meta["rows"]
    assert f"| {dead_orders[2]} | ord-2 | order.created | BAD_REQUEST |" in meta["refused_rows"]
    assert instance.get_run_by_id(result.run_id).tags[DRY_RUN_TAG] == "false"
    assert statuses(conn, ORDERS) == {"pending": 2, "dead": 1}
    audited = conn.execute("SELECT worker FROM outbox_audit WHERE code = 'outbox_replay'").fetchall()
    assert len(audited) == 2 and audited[0]["worker"].startswith("dagster:")


def test_no_filter_is_refused_with_what_to_set(conn, instance, resources, dead_orders):
    before = _snapshot(conn)
    result = run_job("replay_dead_job", resources, instance, _config(dry_run=False))
    assert not result.success
    message = _failure(result)
    assert "needs a filter" in message and "all: true" in message
    assert _snapshot(conn) == before


def test_unknown_error_code_is_refused_with_the_known_ones(conn, instance, resources, dead_orders):
    result = run_job("replay_dead_job", resources, instance, _config(error_code="BROKER_500", dry_run=False))
    assert not result.success
    message = _failure(result)
    assert "'BROKER_500' is unknown" in message and "NETWORK_TIMEOUT" in message and "BROKER_5XX" in message
    assert statuses(conn, ORDERS) == {"dead": 3}


@pytest.mark.parametrize("field", ["since", "until"])
def test_bad_time_fails_before_touching_the_database(instance, field):
    # An unreachable database: the run must fail on the config, never get as far as connecting.
    resources = outbox_resources(url="postgresql://nobody@127.0.0.1:9/none")
    result = run_job("replay_dead_job", resources, instance, _config(**{field: "04:14"}, dry_run=False))
    assert not result.success
    message = _failure(result)
    assert f'{field}="04:14" is not a time: use ISO 8601 like 2026-11-21T10:00:00Z' in message
    assert "cannot connect" not in message


def test_bad_id_is_refused_by_the_config():
    with pytest.raises(ValueError, match="does not fit a row id"):
        ReplayConfig(ids=[99999999999999999999])
    with pytest.raises(ValueError, match='since="04:14" is not a time'):
        ReplayConfig(since="04:14")
    assert ReplayConfig(since="2h", until="2026-11-21T10:00:00Z").since == "2h"


def test_op_checks_the_config_again_before_any_database_access():
    import dagster as dg

    from outbox_pipelines.defs.replay import selection_from_config

    unchecked = ReplayConfig.model_construct(table=ORDERS, since="04:14", all=False)
    with pytest.raises(dg.Failure, match='since="04:14" is not a time'):
        selection_from_config(unchecked)
    with pytest.raises(dg.Failure, match="set all: true"):
        selection_from_config(ReplayConfig(table=ORDERS))
    assert selection_from_config(ReplayConfig(table=ORDERS, all=True)).is_empty()
