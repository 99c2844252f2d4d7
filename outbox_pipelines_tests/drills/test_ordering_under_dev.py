"""Ordering keys under `outbox-pipelines dev` in an adopter's project, as on-call meets them (issue 24).

The team's keyed table is relayed by dev's own relay group run (started by its backlog sensor) to a webhook
that throttles and fails about one request in five; one key's second version is rejected for good (400).
What must hold: every other key arrives in order; the rejected key is parked, not skipped silently; the
blocked_keys check alerts once, naming the key and the dead message; the operator's skip_dead_job (a dry
run, then for real, launched as the launchpad does) lets the rest of that key go, in order.
"""

import re
import time
from collections.abc import Iterator

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.drills.many_tables import LAUNCH, REPOSITORY, RUN, RUNS, ManyTablesStack
from outbox_pipelines_tests.drills.test_ordering_drills import flaky, out_of_order, per_key
from outbox_pipelines_tests.helpers import wait_until

pytestmark = pytest.mark.drill
KEYS, VERSIONS = 30, 5
POISON = "org7-v2"


def webhook(key: str, attempt: int, body: object):
    if key == POISON:
        return 400, {}, b'{"error": "invalid org"}'
    return flaky(key, attempt, body)


@pytest.fixture(scope="module")
def stack(pg_server) -> Iterator[ManyTablesStack]:
    stack = ManyTablesStack(pg_server, 1)
    stack.sink.script = webhook
    try:
        stack.start()
        yield stack
    finally:
        stack.close()


@pytest.mark.timeout(600)
def test_keys_stay_in_order_under_dev_and_a_parked_key_is_alerted_then_skipped(stack: ManyTablesStack) -> None:
    [table] = stack.tables
    started = time.monotonic()
    with stack.connect(autocommit=False) as conn:
        for v in range(1, VERSIONS + 1):  # version by version, as the aggregates change
            Outbox(table).enqueue_many(
                conn,
                [
                    Message(topic="org.changed", payload={"v": v}, event_id=f"org{k}-v{v}", ordering_key=f"org{k}")
                    for k in range(KEYS)
                ],
                outside_transaction=True,
            )
            conn.commit()

    def settled() -> bool:
        return stack.scalar(f"SELECT count(*) FROM {table} WHERE status = 'sent'") == KEYS * VERSIONS - 4

    wait_until(
        settled, 180, "every key but the parked one delivered", interval_s=0.5, on_timeout=lambda: stack.diagnostics()
    )
    assert stack.scalar(f"SELECT count(*) FROM {table} WHERE ordering_blocked") == 3  # org7 v3..v5 wait

    parked = stack.receiver.wait_for(
        lambda a: a.get("kind") == "check" and a.get("check") == "blocked_keys" and a.get("status") == "firing",
        since=started,
        timeout_s=120,
        what="the blocked_keys alert",
    )
    dead_id = stack.scalar(f"SELECT id FROM {table} WHERE event_id = %s", (POISON,))
    assert f"key org7: id {dead_id} died with" in parked.body["summary"], parked.body

    [repo] = stack.graphql(REPOSITORY)["repositoriesOrError"]["nodes"]
    selector = {
        "repositoryLocationName": repo["location"]["name"],
        "repositoryName": repo["name"],
        "jobName": "skip_dead_job",
    }

    def skip(dry_run: bool) -> str:
        config = {
            "ops": {
                "skip_dead_op": {
                    "config": {
                        "table": table,
                        "ordering_key": "org7",
                        "dry_run": dry_run,
                        "reason": "invalid org, fixed upstream",
                    }
                }
            }
        }
        launched = stack.graphql(LAUNCH, {"params": {"selector": selector, "runConfigData": config}})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        return wait_until(
            lambda: (
                (s := stack.graphql(RUN, {"id": run_id})["runOrError"]["status"]) in ("SUCCESS", "FAILURE", "CANCELED")
                and s
            ),
            120,
            "the skip run to end",
        )

    assert skip(dry_run=True) == "SUCCESS"
    assert stack.scalar(f"SELECT count(*) FROM {table} WHERE ordering_blocked") == 3  # a dry run changes nothing
    assert skip(dry_run=False) == "SUCCESS"
    wait_until(
        lambda: stack.scalar(f"SELECT count(*) FROM {table} WHERE status = 'sent'") == KEYS * VERSIONS - 1,
        120,
        "the rest of org7 delivered",
        interval_s=0.5,
    )

    received = [r for r in stack.sink.received if r.key.startswith("org")]
    assert {r.status for r in received} >= {200, 400, 429, 503}
    broken = out_of_order([r for r in received if not r.key.startswith("org7-")], VERSIONS)
    assert broken == {}
    org7 = [(r.key, r.status) for r in per_key(received)["org7"] if r.status == 200]
    assert [k for k, _ in org7] == ["org7-v1", "org7-v3", "org7-v4", "org7-v5"]
    failed = stack.graphql(RUNS, {"filter": {"statuses": ["FAILURE"]}})["runsOrError"]["results"]
    assert failed == [], f"failed runs: {failed}"
    # dev's terminal: the outbox's lines and Dagster's runs, not its ticks that found nothing to do.
    terminal = stack.dev_log.read_text()
    assert "Dagster UI: http://" in terminal
    assert not re.search(
        r"Sensor \S+ skipped: |No run requests returned for |Checking for new runs for sensor", terminal
    ), "sensor tick noise in dev's terminal"
    assert "Found a dagster instance configuration value" not in terminal
