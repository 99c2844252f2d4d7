"""Drills for many module tables under one `outbox-pipelines dev` (issue 23), as an adopting team runs it.

A dozen tables here (the soak runs 50: soak/test_fifty_tables.py), in a project directory of the team's,
with its mistakes: an unimportable handlers module, an invalid section, a destination that is down.

1. Every table drains within 60 s of one big enqueue, each message delivered once, by one relay group
   run; the Dagster processes under dev stay under 1.5 GB of resident memory.
2. Each mistake is told once, by its own table's check and one alert: no failed run, no run_failure alert,
   and the other tables relay.
3. Maintenance never starves: with relay runs filling every slot they may take (and more queued),
   requeue_stuck_job and the checks job leave the queue (their process starting) within a minute of being submitted.
"""

import time
from collections.abc import Iterator

import pytest

from outbox_pipelines_tests.drills.many_tables import (
    BROKEN_IMPORT,
    BROKEN_SECTION,
    DOWN,
    GIB,
    LAUNCH,
    REPOSITORY,
    RUN,
    RUNS,
    TERMINATE,
    ManyTablesStack,
)
from outbox_pipelines_tests.helpers import wait_until

pytestmark = pytest.mark.drill
TABLES = 12
PER_TABLE = 50


@pytest.fixture(scope="module")
def many(pg_server) -> Iterator[ManyTablesStack]:
    stack = ManyTablesStack(pg_server, TABLES)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()


def drain(stack: ManyTablesStack, prefix: str) -> float:
    """Enqueue PER_TABLE messages into every table; the seconds until every good table has sent them all."""
    committed = stack.enqueue_everywhere(PER_TABLE, prefix)

    def drained() -> bool:
        return all(stack.sent_in(name, prefix) == PER_TABLE for name in stack.tables)

    wait_until(
        drained,
        120,
        f"all {len(stack.tables)} tables drained",
        interval_s=0.25,
        on_timeout=lambda: (
            "sent per table: " + str({n: stack.sent_in(n, prefix) for n in stack.tables}) + "\n" + stack.diagnostics()
        ),
    )
    return time.monotonic() - committed


@pytest.mark.timeout(600)
def test_every_table_drains_within_a_minute_each_message_once(many: ManyTablesStack) -> None:
    seconds = drain(many, "burst")
    keys = {key: n for key, n in many.sink.counts.items() if key.startswith("burst-")}
    assert len(keys) == TABLES * PER_TABLE and set(keys.values()) == {1}, "each message delivered once"
    assert seconds <= 60, f"drained in {seconds:.1f} s"
    rss, processes = many.rss_bytes()
    print(
        f"\n{TABLES} tables drained {PER_TABLE} each in {seconds:.1f} s; {processes} processes under dev, "
        f"{rss / GIB:.2f} GiB resident"
    )
    assert rss <= 1.5 * GIB, f"{rss / GIB:.2f} GiB under dev"
    runs = many.graphql(RUNS, {"filter": {"tags": [{"key": "outbox/kind", "value": "relay"}]}})
    relay_runs = runs["runsOrError"]["results"]
    assert 1 <= len(relay_runs) <= 2, f"one group run (two at a hand-off), not a run per table: {relay_runs}"


@pytest.mark.timeout(300)
def test_each_mistake_is_told_once_by_its_table_and_no_run_fails(many: ManyTablesStack) -> None:
    def relay_alert(table: str):
        return lambda a: (
            a.get("kind") == "check"
            and a.get("check") == "relay"
            and a.get("table") == table
            and a.get("status") == "firing"
        )

    since = 0.0
    imports = many.receiver.wait_for(
        relay_alert(BROKEN_IMPORT), since=since, timeout_s=120, what=f"relay alert for {BROKEN_IMPORT}"
    )
    assert "cannot import payroll" in imports.body["summary"], imports.body
    section = many.receiver.wait_for(
        relay_alert(BROKEN_SECTION), since=since, timeout_s=60, what=f"relay alert for {BROKEN_SECTION}"
    )
    assert "mode must be one of competing, single-active, got 'compting'" in section.body["summary"]
    down = many.receiver.wait_for(
        lambda a: a.get("check") == "destination" and a.get("table") == DOWN,
        since=since,
        timeout_s=120,
        what=f"destination alert for {DOWN}",
    )
    assert down.body["status"] == "firing"
    time.sleep(20)  # a further on-call sweep or two: nothing said twice, no failed run
    alerts = many.receiver.alerts
    firing = [(a.get("table"), a.get("check")) for a in alerts if a.get("status") == "firing" and not a.get("reminder")]
    assert firing.count((BROKEN_IMPORT, "relay")) == 1 and firing.count((BROKEN_SECTION, "relay")) == 1
    assert not [a for a in alerts if a.get("kind") in ("run_failure", "relay_died")], "a mistake paged as a failure"
    failed = many.graphql(RUNS, {"filter": {"statuses": ["FAILURE"]}})["runsOrError"]["results"]
    assert failed == [], f"failed runs: {failed}"
    assert many.scalar(f"SELECT count(*) FROM {BROKEN_IMPORT} WHERE status = 'pending'") == PER_TABLE  # kept


@pytest.mark.timeout(600)
def test_maintenance_starts_within_a_minute_while_relay_runs_fill_their_slots(many: ManyTablesStack) -> None:
    [repo] = many.graphql(REPOSITORY)["repositoriesOrError"]["nodes"]
    selector = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}

    def launch(job: str, run_config: dict | None = None) -> str:
        launched = many.graphql(
            LAUNCH, {"params": {"selector": {**selector, "jobName": job}, "runConfigData": run_config or {}}}
        )["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]["runId"]

    # Ten one-table relay runs on top of the group's: more than the 8 slots relay runs may take.
    relays = [
        launch("relay_job", {"ops": {"relay_table": {"config": {"table": name, "max_seconds": 240}}}})
        for name in many.tables[:10]
    ]
    try:

        def relay_slots_full() -> bool:
            statuses = [many.graphql(RUN, {"id": run_id})["runOrError"]["status"] for run_id in relays]
            return statuses.count("QUEUED") >= 2

        wait_until(relay_slots_full, 120, "relay runs to fill their slots (some left queued)")
        for job in ("requeue_stuck_job", "outbox_checks_job"):
            submitted = time.monotonic()
            run_id = launch(job)

            def started(run_id: str = run_id) -> bool:
                # Out of the queue, given its slot: STARTING is its process importing Dagster, which on a machine
                # busy with ten relay runs' processes took longer than the minute the queue is held to (CI).
                status = many.graphql(RUN, {"id": run_id})["runOrError"]["status"]
                return status in ("STARTING", "STARTED", "SUCCESS")

            wait_until(started, 60, f"{job} to leave the queue while relay runs are queued", interval_s=0.5)
            print(
                f"\n{job} started {time.monotonic() - submitted:.1f} s after it was submitted, "
                "with relay runs still queued"
            )
    finally:
        for run_id in relays:
            many.graphql(TERMINATE, {"id": run_id})
