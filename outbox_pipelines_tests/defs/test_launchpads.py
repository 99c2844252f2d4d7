"""Issue 43 (item 5): the launchpads of replay_dead_job, skip_dead_job and backfill_job explain themselves.

Asked through Dagster's GraphQL, as the launchpad asks it (``runConfigSchemaOrError``: ``rootDefaultYaml`` is what
the launchpad opens with, ``isRunConfigValid`` what it checks before the Launch button): every filter is written
out with a neutral default, the table is one of the code location's tables (the default when there is only one),
and a mistyped table or a value of the wrong type is refused before any run exists.
"""

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster_graphql.test.utils import execute_dagster_graphql

JOBS = {"replay_dead_job": "replay_dead_op", "skip_dead_job": "skip_dead_op", "backfill_job": "backfill_op"}
PROJECT_TABLES = ["outbox_events", "outbox_members", "outbox_memory", "outbox_orders"]

SCHEMA = """
query ($selector: PipelineSelector!, $config: RunConfigData) {
  runConfigSchemaOrError(selector: $selector) {
    __typename
    ... on RunConfigSchema {
      rootDefaultYaml
      isRunConfigValid(runConfigData: $config) {
        __typename
        ... on RunConfigValidationInvalid { errors { message reason } }
      }
      allConfigTypes { key ... on EnumConfigType { givenName values { value } } }
    }
  }
}
"""


@contextmanager
def workspace(source: str, tmp_path: Path) -> Iterator[Any]:
    """A Dagster workspace (the webserver's, in process) loading the code location ``source`` defines."""
    path = tmp_path / "location.py"
    path.write_text(textwrap.dedent(source))
    with dg.instance_for_test() as instance:
        origin = LoadableTargetOrigin(python_file=str(path), attribute="defs", working_directory=str(tmp_path))
        with in_process_test_workspace(instance, origin) as context:
            yield context


def schema(context: Any, job: str, config: dict | None = None) -> dict:
    [location] = context.code_location_names
    [repository] = context.get_code_location(location).get_repositories()
    selector = {"repositoryLocationName": location, "repositoryName": repository, "pipelineName": job}
    result = execute_dagster_graphql(context, SCHEMA, {"selector": selector, "config": config or {}})
    assert not result.errors, result.errors
    answer = result.data["runConfigSchemaOrError"]
    assert answer["__typename"] == "RunConfigSchema", answer
    return answer


def opened_with(answer: dict, op: str) -> dict:
    """The op's config the launchpad opens with (its default YAML)."""
    return yaml.safe_load(answer["rootDefaultYaml"])["ops"][op]["config"]


def refusals(answer: dict) -> list[str]:
    checked = answer["isRunConfigValid"]
    if checked["__typename"] == "PipelineConfigValidationValid":
        return []
    assert checked["__typename"] == "RunConfigValidationInvalid", checked
    return [error["message"] for error in checked["errors"]]


def as_opened(context: Any, job: str, answer: dict) -> dict:
    """The launchpad's check of its config as it opens (its default YAML, untouched)."""
    return schema(context, job, yaml.safe_load(answer["rootDefaultYaml"]))


def table_choice(answer: dict) -> list[str]:
    [enum] = [t for t in answer["allConfigTypes"] if t.get("givenName") == "OutboxTableName"]
    return [value["value"] for value in enum["values"]]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Iterator[Any]:
    """This repository's code location: the demo's four tables."""
    with workspace("from outbox_pipelines.definitions import defs\n", tmp_path_factory.mktemp("project")) as context:
        yield context


def test_each_launchpad_opens_with_every_filter_written_out_and_no_table_chosen(project):
    replay = schema(project, "replay_dead_job")
    assert opened_with(replay, "replay_dead_op") == {
        "ids": [],
        "topic": "",
        "tenant_id": "",
        "error_code": "",
        "since": "",
        "until": "",
        "all": False,
        "dry_run": True,
        "force": False,
        "reason": "",
    }
    assert opened_with(schema(project, "skip_dead_job"), "skip_dead_op") == {
        "ids": [],
        "ordering_key": "",
        "reason": "skipped by an operator",
        "dry_run": True,
    }
    assert opened_with(schema(project, "backfill_job"), "backfill_op") == {
        "dry_run": True,
        "reason": "backfilled by an operator",
        "batch_size": 500,
    }
    for job, op in JOBS.items():
        answer = schema(project, job)
        assert "outbox_orders" not in answer["rootDefaultYaml"], job  # no demo table is anyone's default
        # What the launchpad shows as it opens: the one blank to fill, the table, and the tables to pick from.
        assert refusals(as_opened(project, job, answer)) == [
            f'Missing required config entry "table" at path root:ops:{op}:config. You must provide this value in '
            "your run config. Example config for the missing entry: {'table': 'outbox_events'}"
        ], job
        assert table_choice(answer) == PROJECT_TABLES, job


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_launch_naming_a_table_that_is_not_one_is_refused_before_any_run(project, job):
    op = JOBS[job]
    answer = schema(project, job, {"ops": {op: {"config": {"table": "outbox_order"}}}})
    assert refusals(answer) == [
        f"Value at path root:ops:{op}:config:table not in enum type OutboxTableName got outbox_order"
    ]
    assert refusals(schema(project, job, {"ops": {op: {"config": {"table": "outbox_orders"}}}})) == []


@pytest.mark.parametrize(
    ("job", "values", "field"),
    [
        ("replay_dead_job", {"ids": "101"}, "ids"),
        ("replay_dead_job", {"dry_run": "no"}, "dry_run"),
        ("skip_dead_job", {"ids": [1.5]}, "ids"),
        ("backfill_job", {"batch_size": "a lot"}, "batch_size"),
        ("backfill_job", {"dry_run": "false please"}, "dry_run"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_before_any_run(project, job, values, field):
    op = JOBS[job]
    [message] = refusals(schema(project, job, {"ops": {op: {"config": {"table": "outbox_events", **values}}}}))
    assert f"root:ops:{op}:config:{field}" in message, message


def test_the_existing_fields_still_launch_as_the_on_call_page_and_the_docs_write_them(project):
    config = {"table": "outbox_orders", "ids": [101], "topic": None, "dry_run": False}  # null: the default
    assert refusals(schema(project, "replay_dead_job", {"ops": {"replay_dead_op": {"config": config}}})) == []
    skip = {"table": "outbox_events", "ordering_key": "org-42", "reason": "poison", "dry_run": True}
    assert refusals(schema(project, "skip_dead_job", {"ops": {"skip_dead_op": {"config": skip}}})) == []


def test_with_one_table_declared_it_is_every_launchpads_default_and_the_launchpad_opens_valid(tmp_path):
    source = """
        from outbox_pipelines.defs.factory import outbox_definitions
        defs = outbox_definitions({"billing_outbox": {"destination": "paper"}})
    """
    with workspace(source, tmp_path) as context:
        for job, op in JOBS.items():
            answer = schema(context, job)
            assert table_choice(answer) == ["billing_outbox"]
            assert opened_with(answer, op)["table"] == "billing_outbox", job
            assert refusals(as_opened(context, job, answer)) == [], job  # opens ready to launch (a dry run)


# relay_job, clean_job and requeue_stuck_job: their table(s) are the same Enum; the run configs the docs, the
# schedules and the tests write launch as before.
TABLE_JOBS = {
    "relay_job": ("relay_table", {"table": "outbox_orders", "once": True}, {"table": "outbox_order"}),
    "clean_job": ("clean_op", {"tables": ["outbox_events", "outbox_memory"], "audit_retention": "30d"}, None),
    "requeue_stuck_job": ("requeue_stuck_op", {"tables": ["outbox_events"]}, None),
}


@pytest.mark.parametrize("job", sorted(TABLE_JOBS))
def test_relay_and_maintenance_launchpads_offer_the_declared_tables_and_refuse_a_typo(project, job):
    op, written, typo = TABLE_JOBS[job]
    answer = schema(project, job)
    assert table_choice(answer) == PROJECT_TABLES
    assert refusals(schema(project, job, {"ops": {op: {"config": written}}})) == []
    field, value = ("table", "outbox_order") if typo else ("tables", ["outbox_events", "outbox_order"])
    [message] = refusals(schema(project, job, {"ops": {op: {"config": {**written, field: value}}}}))
    assert "not in enum type OutboxTableName got outbox_order" in message, message
    if job != "relay_job":  # no table named: every declared table, as the schedules launch them
        assert opened_with(answer, op)["tables"] == [] and refusals(as_opened(project, job, answer)) == []
