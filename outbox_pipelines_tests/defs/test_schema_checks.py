"""The code location's schema checks: ``schema_version`` fails (ERROR) on a schema older than the code while the
definitions still load and run, and ``schema_drift`` says the sentences ``db status`` prints (WARN for an index,
ERROR for a function)."""

import dagster as dg

from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage import schema_version
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.schema_drift import find_drift
from outbox_pipelines_tests.defs.conftest import run_job

TABLE = "outbox_events"


def drift_of(db_url: str, tables: list[str]) -> list:
    with connect(db_url) as conn:
        return find_drift(conn, tables, load_settings().parts)


def _schema_checks(result) -> dict[str, tuple[bool, str, str]]:
    found = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            data = event.event_specific_data
            if data.asset_key == dg.AssetKey(["outbox_schema"]):
                found[data.check_name] = (data.passed, data.severity.value, data.description)
    return found


def test_the_code_location_checks_show_the_same_sentences(db_url, conn, instance, resources):
    healthy = _schema_checks(run_job("outbox_checks_job", resources, instance))
    assert {name: passed for name, (passed, _, _) in healthy.items()} == {"schema_version": True, "schema_drift": True}
    conn.execute(f"DROP INDEX {TABLE}_sending_by_lease")
    result = run_job("outbox_checks_job", resources, instance)
    drift = _schema_checks(result)["schema_drift"]
    expected = drift_of(db_url, sorted(load_settings().tables))
    assert drift == (False, "WARN", "\n".join(d.sentence for d in expected))
    conn.execute("DROP FUNCTION outbox_lease_lost_detail")
    assert _schema_checks(run_job("outbox_checks_job", resources, instance))["schema_drift"][:2] == (False, "ERROR")


def test_a_schema_older_than_the_code_fails_the_version_check_and_the_code_location_still_loads(
    db_url, conn, instance, resources
):
    newest = schema_version.needed()[-1][0]
    conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s", (newest,))
    result = run_job("outbox_checks_job", resources, instance)  # the definitions load: no crash loop
    passed, severity, description = _schema_checks(result)["schema_version"]
    assert (passed, severity) == (False, "ERROR")
    assert description.startswith(f"the database schema is at {schema_version.needed()[-2][0]}, this version needs ")
    assert description.endswith("run 'outbox-pipelines db upgrade'")
