"""Issue 43 (items 1 and 2): each table's health where open-source Dagster shows it, and what died on its checks.

The on-call sensor and the checks job record each table's state as its checks saw it (a materialization with its
figures and ``health``) before its check evaluations. Asked through Dagster's GraphQL the way the Catalog asks
(``assetMaterializations``, each check's ``executionForLatestMaterialization``): a table with an ERROR check is
red ("checks failed"), a healthy one is not, and none reads "Never materialized". The dead_letters and
blocked_keys checks carry their messages as a table; the sensor's cursor is a line a person reads.
"""

import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import dagster as dg
import pytest
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster_graphql.test.utils import execute_dagster_graphql

from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.oncall.checks import CheckVerdict
from outbox_pipelines.defs.checks import table_asset
from outbox_pipelines.defs.links import ONCALL_URL_ENV, DagsterLinks, oncall_page_url
from outbox_pipelines.defs.oncall_cursor import Recorded, tables_to_record
from outbox_pipelines.defs.oncall_sensor import oncall_sensor
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import run_job
from outbox_pipelines_tests.helpers import db_now
from outbox_pipelines_tests.rows import make_dead
from outbox_pipelines_tests.scratch import DEMO_PARTS

FAILING, WARNING, HEALTHY, OTHER = "outbox_orders", "outbox_events", "outbox_members", "outbox_memory"
TABLES = sorted([FAILING, WARNING, HEALTHY, OTHER])
CATALOG = """
query ($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    description
    isMaterializable
    isObservable
    assetMaterializations(limit: 1) {
      runId
      metadataEntries { label ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } }
    }
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          executionForLatestMaterialization {
            status
            evaluation {
              severity
              metadataEntries {
                label
                ... on TableMetadataEntry { table { records schema { columns { name } } } }
              }
            }
          }
        }
      }
    }
  }
}"""


@pytest.fixture
def instance(persistent_instance):
    """What is evaluated here (schedules, sensors) refers to its instance: one on disk."""
    return persistent_instance


def enqueue(conn, table: str, event_id: str, key: str | None = None, tenant: str | None = None) -> int:
    message = Message(
        topic="orders.placed", payload={"e": event_id}, event_id=event_id, ordering_key=key, tenant_id=tenant
    )
    return Outbox(table).enqueue(conn, message, outside_transaction=True).id


@pytest.fixture
def resources(db_url, tmp_path):
    """The repository's tables; outbox_orders fails its dead_letters check at 2 dead messages."""
    config = tmp_path / "outbox.toml"
    config.write_text(DEMO_PARTS + "[tables.outbox_orders]\ndead_error = 2\n")
    return outbox_resources(url=db_url, config_path=str(config))


@pytest.fixture
def scene(conn) -> dict[str, int]:
    """outbox_orders: two dead messages (ERROR); outbox_events: a key blocked by its dead head, one message
    behind it (WARN: dead_letters and blocked_keys); outbox_members and outbox_memory: healthy."""
    now = db_now(conn)
    ids = {
        "o1": enqueue(conn, FAILING, "o1", tenant="acme"),
        "o2": enqueue(conn, FAILING, "o2"),
        "k1a": enqueue(conn, WARNING, "k1a", key="k1", tenant="globex"),
        "k1b": enqueue(conn, WARNING, "k1b", key="k1", tenant="globex"),
    }
    make_dead(conn, FAILING, ids["o1"], code="BAD_REQUEST", error="HTTP 400: bad field", at=now - timedelta(hours=2))
    make_dead(conn, FAILING, ids["o2"], code="BROKER_5XX", error="HTTP 503", attempts=8, at=now - timedelta(hours=1))
    make_dead(conn, WARNING, ids["k1a"], code="BAD_REQUEST", error="HTTP 422: no such customer", attempts=1)
    return ids


def oncall_tick(instance, resources, cursor: str | None = None) -> dg.SensorResult:
    with dg.build_sensor_context(
        instance=instance, resources={"outbox_db": resources["outbox_db"]}, cursor=cursor
    ) as context:
        return oncall_sensor(context)


def recorded(result: dg.SensorResult) -> dict[str, list[Any]]:
    """The events of each table recorded on this tick, in order."""
    by_table: dict[str, list[Any]] = {}
    for event in result.asset_events:
        by_table.setdefault(event.asset_key.path[-1], []).append(event)
    return by_table


def values(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def test_each_table_is_recorded_as_its_state_then_its_checks(instance, resources, scene):
    result = oncall_tick(instance, resources)
    tables = recorded(result)
    assert sorted(tables) == TABLES  # a first tick records every table
    for table_name, events in tables.items():
        state, *checks = events
        assert isinstance(state, dg.AssetMaterialization), (table_name, events)
        assert all(isinstance(e, dg.AssetCheckEvaluation) for e in checks) and len(checks) == 8, table_name
    health = {t: values(events[0].metadata)["health"] for t, events in tables.items()}
    assert health == {FAILING: "failing", WARNING: "warning", HEALTHY: "healthy", OTHER: "healthy"}
    failing = values(tables[FAILING][0].metadata)
    assert (failing["dead"], failing["checks not passing"]) == (2, "dead_letters error")
    warned = values(tables[WARNING][0].metadata)
    assert (warned["dead"], warned["pending"], warned["blocked_keys"], warned["blocked_messages"]) == (1, 1, 1, 1)
    assert warned["checks not passing"] == "blocked_keys warn, dead_letters warn"
    assert "as its checks saw it: failing (dead_letters error)" in (tables[FAILING][0].description or "")


def test_the_cursor_says_how_each_table_was_recorded_and_each_tick_records_only_what_changed(
    instance, resources, scene, conn
):
    first = oncall_tick(instance, resources)
    assert first.cursor == (
        "failing: outbox_orders (dead_letters error) | warning: outbox_events (blocked_keys warn, dead_letters warn) "
        "| healthy: outbox_members, outbox_memory"
    )
    # Nothing changed: one table in turn (4 tables, 15 s ticks, each within 5 min), from the first by name.
    second = oncall_tick(instance, resources, cursor=first.cursor)
    assert sorted(recorded(second)) == [WARNING]
    assert second.cursor == first.cursor + " | refreshed: outbox_events"
    # A table turns: it is recorded now, besides the next in turn.
    make_dead(conn, OTHER, enqueue(conn, OTHER, "m1"), code="BAD_REQUEST")
    third = oncall_tick(instance, resources, cursor=second.cursor)
    assert sorted(recorded(third)) == [HEALTHY, OTHER]
    assert third.cursor == (
        "failing: outbox_orders (dead_letters error) | warning: outbox_events (blocked_keys warn, dead_letters warn), "
        "outbox_memory (dead_letters warn) | healthy: outbox_members | refreshed: outbox_members"
    )
    assert third.skip_reason is not None and "recorded 2 tables" in (third.skip_reason.skip_message or "")
    # A cursor that does not read as one (an older version's JSON, an edit) records every table again.
    assert sorted(recorded(oncall_tick(instance, resources, cursor=json.dumps({"recorded": {}})))) == TABLES


def verdicts_of(grades: dict[str, str]) -> dict[str, list[CheckVerdict]]:
    return {table: [CheckVerdict("dead_letters", grade, "", {})] for table, grade in grades.items()}  # type: ignore[arg-type]


def test_a_tick_records_a_few_tables_the_worst_first_and_every_table_within_the_interval():
    grades = {f"mod{i:02d}_outbox": "ok" for i in range(20)} | {"mod13_outbox": "error", "mod17_outbox": "warn"}
    verdicts = verdicts_of(grades)
    due, record = tables_to_record(verdicts, None, every_s=300, tick_s=15, most=6)
    assert (
        len(due) == 6 and due[:2] == ["mod00_outbox", "mod01_outbox"] and {"mod13_outbox", "mod17_outbox"} <= set(due)
    )
    assert record.render().startswith(
        "failing: mod13_outbox (dead_letters error) | warning: mod17_outbox (dead_letters"
    )
    assert "| to record: mod04_outbox, mod05_outbox," in record.render()
    seen, ticks = set(due), 1
    while len(seen) < 20:  # the tables never recorded follow, six a tick
        due, record = tables_to_record(verdicts, Recorded.parse(record.render()), every_s=300, tick_s=15, most=6)
        seen |= set(due)
        ticks += 1
    assert ticks == 4 and "to record" not in record.render()
    # Then one a tick in turn: each table again within 300 s (20 ticks of 15 s).
    last = dict.fromkeys(grades, ticks)
    for tick in range(ticks + 1, ticks + 41):
        due, record = tables_to_record(verdicts, Recorded.parse(record.render()), every_s=300, tick_s=15, most=6)
        assert len(due) == 1
        for table in due:
            assert tick - last[table] <= 20, (table, tick, last[table])
            last[table] = tick


def test_dead_and_blocked_messages_are_a_table_on_their_checks_newest_first(instance, resources, scene):
    tables = recorded(oncall_tick(instance, resources))
    checks = {t: {e.check_name: e for e in events[1:]} for t, events in tables.items()}
    dead = checks[FAILING]["dead_letters"].metadata["messages"]
    assert isinstance(dead, dg.TableMetadataValue)
    assert [c.name for c in dead.schema.columns] == [
        "event id",
        "topic",
        "key",
        "tenant",
        "attempts",
        "error code",
        "error",
        "time (UTC)",
    ]
    rows = [r.data for r in dead.records]
    assert [(r["event id"], r["error code"], r["error"], r["tenant"]) for r in rows] == [
        ("o2", "BROKER_5XX", "HTTP 503", None),
        ("o1", "BAD_REQUEST", "HTTP 400: bad field", "acme"),
    ]
    assert rows[0]["attempts"] == 8 and rows[0]["time (UTC)"] > rows[1]["time (UTC)"]
    [head] = [r.data for r in checks[WARNING]["blocked_keys"].metadata["messages"].records]
    assert (head["event id"], head["key"], head["error"], head["waiting behind"]) == (
        "k1a",
        "k1",
        "HTTP 422: no such customer",
        1,
    )
    # Nothing is read for a table without dead or blocked messages.
    assert "messages" not in checks[HEALTHY]["dead_letters"].metadata
    assert "messages" not in checks[FAILING]["blocked_keys"].metadata


@contextmanager
def catalog(instance, db_url: str, resources_config: str, tmp_path) -> Iterator[Any]:
    """The webserver's workspace (in process) over ``instance``, loading the repository's code location."""
    location = tmp_path / "location.py"
    location.write_text(
        textwrap.dedent(
            f"""
            from outbox_pipelines.definitions import build_definitions
            from outbox_pipelines.defs.resources import outbox_resources

            defs = build_definitions(outbox_resources(url={db_url!r}, config_path={resources_config!r}))
            """
        )
    )
    origin = LoadableTargetOrigin(python_file=str(location), attribute="defs", working_directory=str(tmp_path))
    with in_process_test_workspace(instance, origin) as context:
        yield context


def catalog_rows(context) -> dict[str, dict[str, Any]]:
    """Per table what the Catalog's Status column reads (buildAssetNodeStatusContent, as research 43 traced it)."""
    keys = [{"path": ["outbox", t]} for t in TABLES]
    result = execute_dagster_graphql(context, CATALOG, {"keys": keys})
    assert not result.errors, result.errors
    rows = {}
    for node in result.data["assetNodes"]:
        checks = {c["name"]: c["executionForLatestMaterialization"] for c in node["assetChecksOrError"]["checks"]}
        red = any(
            ex is not None
            and (
                ex["status"] == "EXECUTION_FAILED"
                or (ex["status"] == "FAILED" and ex["evaluation"]["severity"] == "ERROR")
            )
            for ex in checks.values()
        )
        [latest] = node["assetMaterializations"] or [None]
        status = "checks failed" if red else "materialized" if latest else "never materialized"
        metadata = {e["label"]: e.get("text", e.get("intValue")) for e in (latest or {}).get("metadataEntries", [])}
        rows[node["assetKey"]["path"][-1]] = {"status": status, "state": metadata, "checks": checks, "node": node}
    return rows


def test_the_catalog_marks_the_failing_table_and_none_reads_never_materialized(
    instance, resources, scene, db_url, tmp_path
):
    config = str(tmp_path / "outbox.toml")
    with catalog(instance, db_url, config, tmp_path) as context:
        assert {t: r["status"] for t, r in catalog_rows(context).items()} == dict.fromkeys(TABLES, "never materialized")
        # The checks job records each table's state in its run, then the checks (counted against it).
        assert run_job("outbox_checks_job", resources, instance).success
        after_job = catalog_rows(context)
        assert {t: r["status"] for t, r in after_job.items()} == {
            FAILING: "checks failed",
            WARNING: "materialized",
            HEALTHY: "materialized",
            OTHER: "materialized",
        }
        assert after_job[WARNING]["state"]["health"] == "warning"
        assert after_job[WARNING]["checks"]["dead_letters"]["evaluation"]["severity"] == "WARN"
        # Then the sensor's tick, recorded as the daemon records it (state first, then the checks, no run).
        for event in oncall_tick(instance, resources).asset_events:
            instance.report_runless_asset_event(event)
        rows = catalog_rows(context)
    assert {t: r["status"] for t, r in rows.items()} == {
        FAILING: "checks failed",
        WARNING: "materialized",
        HEALTHY: "materialized",
        OTHER: "materialized",
    }
    assert {t: r["state"]["health"] for t, r in rows.items()} == {
        FAILING: "failing",
        WARNING: "warning",
        HEALTHY: "healthy",
        OTHER: "healthy",
    }
    failing = rows[FAILING]
    assert failing["node"]["assetMaterializations"][0]["runId"] == ""  # the sensor's, the latest
    assert failing["checks"]["dead_letters"] == {
        "status": "FAILED",
        "evaluation": {
            "severity": "ERROR",
            "metadataEntries": failing["checks"]["dead_letters"]["evaluation"]["metadataEntries"],
        },
    }
    [messages] = [
        e for e in failing["checks"]["dead_letters"]["evaluation"]["metadataEntries"] if e["label"] == "messages"
    ]
    assert [json.loads(r)["event id"] for r in messages["table"]["records"]] == ["o2", "o1"]
    assert all(ex["status"] == "SUCCEEDED" for ex in rows[HEALTHY]["checks"].values())
    assert not rows[HEALTHY]["node"]["isMaterializable"]  # still an external table: no Materialize of ours


def test_the_table_links_the_oncall_page_when_one_is_served(monkeypatch):
    monkeypatch.delenv(ONCALL_URL_ENV, raising=False)
    assert oncall_page_url("outbox_orders") is None and DagsterLinks().oncall("outbox_orders") is None
    spec = table_asset("outbox_orders")
    assert "on-call page" not in (spec.description or "") and "on-call page" not in spec.metadata
    assert "never materialized" not in (spec.description or "")
    monkeypatch.setenv(ONCALL_URL_ENV, "http://127.0.0.1:13401/")
    page = "http://127.0.0.1:13401/tables/outbox_orders"
    assert oncall_page_url("outbox_orders") == page and oncall_page_url(None) == "http://127.0.0.1:13401/"
    spec = table_asset("outbox_orders")
    assert f"[on-call page]({page})" in (spec.description or "")
    assert spec.metadata["on-call page"] == dg.MetadataValue.url(page)
