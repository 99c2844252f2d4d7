"""From the on-call page to a Dagster run and back: Replay… launches replay_dead_job as a dry run through the real
webserver's GraphQL API, the page shows what it would do with a link to the run, and only then runs it for real,
with the reason kept on the run."""

import re
import time

import httpx
import pytest

from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.oncall_page import serve_in_thread
from outbox_pipelines_tests.defs.test_webserver import RUN, graphql, webserver  # noqa: F401 (the fixture)
from outbox_pipelines_tests.helpers import audit_codes, enqueue_n, rows
from outbox_pipelines_tests.rows import make_dead

pytestmark = pytest.mark.slow  # a real dagster-webserver process

EVENTS = "outbox_events"


def finished_page(client: httpx.Client, location: str, timeout_s: float = 120) -> str:
    """The run's page once the run ended (it stops refreshing itself then)."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = client.get(location).text
        if 'http-equiv="refresh"' not in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"the run did not end in {timeout_s} s: {text[-2000:]}")


def test_replay_from_the_page_dry_run_first_then_for_real_with_a_reason(webserver, db_url, conn):  # noqa: F811
    [row_id] = enqueue_n(conn, EVENTS, 1, topic="org.changed", prefix="evt-")
    make_dead(conn, EVENTS, row_id, code="BROKER_5XX", error="HTTP 503 from the broker", attempts=8)
    page = serve_in_thread(
        "127.0.0.1", 0, database_url=db_url, settings=load_settings(env={}, path=None), ui_url=webserver
    )
    try:
        with httpx.Client(base_url=page.url, timeout=60, headers={"Origin": page.url}) as client:
            table = client.get(f"/tables/{EVENTS}").text
            assert "evt-0" in table and "Replay…" in table
            launched = client.post("/actions/replay", data={"table": EVENTS, "event_id": "evt-0"})
            assert launched.status_code == 303, launched.text
            location = launched.headers["location"]
            run_id = re.fullmatch(r"/runs/([0-9a-f-]+)\?.*", location).group(1)

            dry = finished_page(client, location)
            assert "dry run, SUCCESS" in dry and f"{webserver}/runs/{run_id}" in dry
            assert "Would replay 1" in dry and "would_replay" in dry
            assert "Run it for real" in dry and 'name="reason"' in dry
            assert rows(conn, EVENTS)[0]["status"] == "dead"  # a dry run changes nothing

            real = client.post(
                "/actions/replay",
                data={"table": EVENTS, "event_id": "evt-0", "real": "1", "reason": "broker back up (INC-42)"},
            )
            assert real.status_code == 303, real.text
            done = finished_page(client, real.headers["location"])
            assert "real run, SUCCESS" in done and "Run it for real" not in done
    finally:
        page.stop()
    assert rows(conn, EVENTS)[0]["status"] == "pending" and "outbox_replay" in audit_codes(conn, EVENTS, row_id)
    [detail] = conn.execute(
        "SELECT detail FROM outbox_audit WHERE code = 'outbox_replay' AND message_id = %s", (row_id,)
    ).fetchall()
    # The reason typed is the job's own (its config), kept in the audit with the error the message died of.
    assert detail["detail"] == "replayed: broker back up (INC-42) (it had died of: HTTP 503 from the broker)"
    real_id = re.search(r"/runs/([0-9a-f-]+)", done).group(1)
    tags = {t["key"]: t["value"] for t in graphql(webserver, RUN, id=real_id)["runOrError"]["tags"]}
    assert tags["outbox/reason"] == "broker back up (INC-42)" and tags["outbox/launched_by"] == "oncall-page"
    assert tags["outbox/dry_run"] == "false"
