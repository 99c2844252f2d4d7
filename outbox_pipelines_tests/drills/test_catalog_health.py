"""What the UI shows at a glance about each table's health (issue 25 item 6), against a live `outbox-pipelines dev`.

Open-source Dagster 1.13 (what dev and deploy/ run) has no health column in its Catalog: the webserver answers
``assetHealth`` with null (``DagsterInstance.dagster_asset_health_queries_supported()`` is False) and the UI's
``assetHealthEnabled()`` / ``observeEnabled()`` are built as ``false``; both belong to Dagster+. So this
drill checks, through GraphQL, the fields the open-source UI reads:

- the Lineage view's "Asset checks" row of a table (``AssetChecksStatusSummary``, ``dag2025``): a red ✗ while
  an ERROR check fails, a yellow ⚠ while only WARN ones fail, else ✓, with "passed / total";
- the Catalog's Status column (``buildAssetNodeStatusContent`` in ``AssetNodeStatusContent.tsx``): each table's
  state as its checks saw it is recorded as a materialization, its checks after it (defs/table_health.py), so it
  reads red "Materialized <time>" while an ERROR check fails (``checksFailed``), else green; never "Never
  materialized".

One table gets ``dead_warn`` dead letters (WARN), one ``dead_error`` (ERROR), put in by SQL; the checks job
runs; a third table stays healthy.
"""

from typing import Any

import pytest

from outbox_pipelines.core.oncall.checks import CHECK_NAMES
from outbox_pipelines_tests.drills.conftest import TABLE, DrillStack
from outbox_pipelines_tests.drills.many_tables import LAUNCH, REPOSITORY
from outbox_pipelines_tests.helpers import wait_until

# In the soak lane (pytest -m soak): it checks what open-source Dagster's UI shows of our checks, behaviour of
# Dagster's that no change of ours moves, and .ci/run keeps to its 30 minutes.
pytestmark = [pytest.mark.drill, pytest.mark.soak]
# The checks on each table: the table checks, and vacuum (defs/database_checks.py).
N = len(CHECK_NAMES) + 1

CHECKS_JOB = "outbox_checks_job"
RUN_STATUS = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
HEALTH = """
query TableHealth($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    isObservable
    isMaterializable
    assetMaterializations(limit: 1) { timestamp }
    assetChecksOrError {
      __typename
      ... on AssetChecks {
        checks {
          name
          executionForLatestMaterialization {
            status
            runId
            evaluation {
              severity
              metadataEntries { label ... on TextMetadataEntry { text } }
            }
          }
        }
      }
    }
  }
  assetsOrError(assetKeys: $keys) {
    ... on AssetConnection { nodes { key { path } assetHealth { assetHealth assetChecksStatus } } }
  }
}"""


def asset_key(table_name: str) -> dict[str, list[str]]:
    return {"path": ["outbox", table_name]}


def run_checks_job(stack: DrillStack) -> str:
    """Launch the checks job through the webserver, as the UI's Launchpad does; its run id once it succeeded."""
    [repo] = stack.dev.graphql(REPOSITORY)["repositoriesOrError"]["nodes"]
    selector = {
        "repositoryLocationName": repo["location"]["name"],
        "repositoryName": repo["name"],
        "jobName": CHECKS_JOB,
    }
    launched = stack.dev.graphql(LAUNCH, {"params": {"selector": selector, "runConfigData": {}}})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    def finished() -> str | None:
        status = stack.dev.graphql(RUN_STATUS, {"id": run_id})["runOrError"].get("status")
        return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

    status = wait_until(finished, 180, f"{CHECKS_JOB} run {run_id[:8]} to finish")
    assert status == "SUCCESS", f"{CHECKS_JOB} run {run_id} ended {status}"
    return run_id


def table_health(stack: DrillStack, tables: list[str]) -> dict[str, dict[str, Any]]:
    """Per table: its asset node (checks by name) and its ``assetHealth``."""
    data = stack.dev.graphql(HEALTH, {"keys": [asset_key(t) for t in tables]})
    health = {n["key"]["path"][-1]: n["assetHealth"] for n in data["assetsOrError"]["nodes"]}
    found = {}
    for node in data["assetNodes"]:
        checks = node["assetChecksOrError"]
        assert checks["__typename"] == "AssetChecks", checks
        table_name = node["assetKey"]["path"][-1]
        found[table_name] = {
            **node,
            "checks": {c["name"]: c for c in checks["checks"]},
            "assetHealth": health.get(table_name),
        }
    assert sorted(found) == sorted(tables), f"asset nodes {sorted(found)}, expected {sorted(tables)}"
    return found


def check_icon(check: dict[str, Any]) -> str:
    """A check's icon in the UI (getAggregateCheckIconType, unpartitioned): ERROR, WARN, or the status."""
    execution = check["executionForLatestMaterialization"]
    if not execution or not execution["status"]:
        return "NOT_EVALUATED"
    if execution["status"] == "FAILED":
        return "WARN" if (execution["evaluation"] or {}).get("severity") == "WARN" else "ERROR"
    if execution["status"] == "EXECUTION_FAILED":
        return "ERROR"
    return execution["status"]


def lineage_checks_row(node: dict[str, Any]) -> tuple[str, int, int]:
    """The Lineage view's "Asset checks" row: (icon, passed, total)."""
    icons = [check_icon(c) for c in node["checks"].values()]
    icon = "ERROR" if "ERROR" in icons else "WARN" if "WARN" in icons else "SKIPPED" if "SKIPPED" in icons else "OK"
    return icon, icons.count("SUCCEEDED"), len(icons)


def catalog_status(node: dict[str, Any]) -> str:
    """The Catalog's Status column for a table (no run in progress, no partitions, no freshness policy)."""
    assert not node["isObservable"], "an observable asset reads 'Observed <time>' in the Catalog, checks ignored"
    checks_failed = any(
        (ex := c["executionForLatestMaterialization"]) is not None
        and (
            (ex["status"] == "FAILED" and (ex["evaluation"] or {}).get("severity") == "ERROR")
            or ex["status"] == "EXECUTION_FAILED"
        )
        for c in node["checks"].values()
    )
    if checks_failed:
        return "red: checks failed"
    if not node["assetMaterializations"] and not node["isMaterializable"]:
        return "–"
    return "materialized" if node["assetMaterializations"] else "never materialized"


def threshold(check: dict[str, Any], label: str) -> int:
    evaluation = (check["executionForLatestMaterialization"] or {}).get("evaluation") or {}
    entries = evaluation.get("metadataEntries") or []
    values = {e["label"]: e.get("text") for e in entries}
    value = values.get(label)
    assert value is not None and value.isdigit(), f"{label} of {check['name']}: {value!r} (metadata {values})"
    return int(value)


def add_dead_letters(stack: DrillStack, table_name: str, n: int, token: str) -> None:
    with stack.connect() as conn:
        conn.execute(
            f"INSERT INTO {table_name} (event_id, topic, payload, payload_sha, status, attempts, last_error, "
            "last_error_code) "
            "SELECT %s || g, 'drill.catalog', '{}'::jsonb, md5(%s || g), 'dead', 5, 'drill: put in by SQL', "
            "'BAD_REQUEST' FROM generate_series(1, %s) AS g",
            (f"drill-{token}-dead-", token, n),
        )


@pytest.mark.timeout(600)
def test_failing_tables_show_at_a_glance_and_a_healthy_one_passes(stack: DrillStack) -> None:
    every = [
        n["assetKey"]["path"][-1]
        for n in stack.dev.graphql("{ assetNodes { assetKey { path } } }")["assetNodes"]
        if n["assetKey"]["path"][0] == "outbox"
    ]
    others = sorted(t for t in every if t != TABLE)
    assert TABLE in every and len(others) >= 2, f"the drill needs {TABLE} and two more tables, found {every}"
    healthy, warned, failed = TABLE, others[0], others[1]
    tables = [healthy, warned, failed]

    # Every table healthy after a first run of the checks; the thresholds come from the checks' own metadata.
    run_checks_job(stack)
    before = table_health(stack, tables)
    for table_name in tables:
        assert lineage_checks_row(before[table_name]) == ("OK", N, N), (table_name, before[table_name]["checks"])
    warn_at = threshold(before[warned]["checks"]["dead_letters"], "dead_warn")
    error_at = threshold(before[failed]["checks"]["dead_letters"], "dead_error")
    assert 0 < warn_at < threshold(before[warned]["checks"]["dead_letters"], "dead_error")

    add_dead_letters(stack, warned, warn_at, stack.token)
    add_dead_letters(stack, failed, error_at, stack.token)
    run_id = run_checks_job(stack)

    def graded() -> dict[str, dict[str, Any]] | None:
        now = table_health(stack, tables)
        ok = (
            check_icon(now[warned]["checks"]["dead_letters"]) == "WARN"
            and check_icon(now[failed]["checks"]["dead_letters"]) == "ERROR"
        )
        return now if ok else None

    now = wait_until(
        graded,
        60,
        f"dead_letters graded WARN on {warned} and ERROR on {failed} after run {run_id[:8]}",
        on_timeout=lambda: f"{table_health(stack, tables)}",
    )

    # The Lineage view: ✓ 7/7 for the healthy table, ⚠ 6/7 and ✗ 6/7 for the others.
    assert lineage_checks_row(now[healthy]) == ("OK", N, N), now[healthy]["checks"]
    assert lineage_checks_row(now[warned]) == ("WARN", N - 1, N), now[warned]["checks"]
    assert lineage_checks_row(now[failed]) == ("ERROR", N - 1, N), now[failed]["checks"]

    # The Catalog's Status: external assets, each "materialized" as its checks saw it; red only on an ERROR check.
    for table_name in tables:
        node = now[table_name]
        assert (node["isObservable"], node["isMaterializable"]) == (False, False), f"{table_name}: {node}"
        assert node["assetMaterializations"], f"{table_name} reads 'Never materialized': {node}"
    assert catalog_status(now[failed]) == "red: checks failed"
    assert catalog_status(now[warned]) == "materialized", "a WARN check does not colour the Catalog's Status"
    assert catalog_status(now[healthy]) == "materialized"

    # Asset health (the Catalog's health column of Dagster+) is not served by open-source Dagster.
    served = {t: now[t]["assetHealth"] for t in tables}
    assert served == dict.fromkeys(tables), (
        f"the webserver now serves assetHealth: {served}. Assert it here instead (failing tables DEGRADED / "
        "WARNING); a healthy table reads UNKNOWN overall while its asset is neither materialized nor observed."
    )
