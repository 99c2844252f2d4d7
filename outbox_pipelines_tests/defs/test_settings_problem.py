"""A declaration that cannot be read at all (a top-level typo in outbox.toml): the code location still loads and
says so, `dg check defs` fails with the same message, and a run that needs the settings fails (and pages)."""

import pytest

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.defs.factory import VALIDATION_ENV, outbox_definitions
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import run_job

TYPO = '[table.billing_outbox]\ndestination = "paper"\n'  # [table.X] for [tables.X]


@pytest.fixture
def broken_toml(tmp_path, monkeypatch):
    path = tmp_path / "outbox.toml"
    path.write_text(TYPO)
    monkeypatch.setenv("OUTBOX_CONFIG", str(path))
    monkeypatch.delenv(VALIDATION_ENV, raising=False)
    return path


def test_the_code_location_loads_without_tables_and_validation_fails_with_the_fix(broken_toml, monkeypatch):
    definitions = outbox_definitions()
    assert definitions.resolve_all_asset_keys() == []
    assert definitions.resolve_sensor_def("outbox_oncall") is not None  # still on call
    monkeypatch.setenv(VALIDATION_ENV, "1")
    with pytest.raises(ConfigError, match=r"unknown top-level keys \['table'\].*\[tables.NAME\]"):
        outbox_definitions()


def test_a_run_that_needs_the_settings_fails_as_a_failure_not_a_refused_launch(broken_toml, db_url, instance):
    resources = outbox_resources(url=db_url, config_path=str(broken_toml))
    result = run_job(
        "relay_job",
        resources,
        instance,
        {"ops": {"relay_table": {"config": {"table": "outbox_events", "once": True}}}},  # one the location offers
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "unknown top-level keys ['table']" in failure.event_specific_data.error.message
    run = instance.get_run_by_id(result.run_id)
    assert run.tags.get("outbox/failure") != "refused_launch"
