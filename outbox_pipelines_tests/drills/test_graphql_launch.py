"""docs/deploy.md's "Launching replay and backfill from code (GraphQL)", run as written (issue 25 item 7).

The section's four Python blocks are executed in one namespace against a running `outbox-pipelines dev` (the
drill stack: a fresh database, broker-sim, dev on a free port). Only HOST and PORT are replaced, and DAY is set
to the day the drill's messages were sent; everything else runs as a reader would paste it, so the document
cannot drift from the jobs.

What must hold: the dry run finds the dead rows its filter names and leaves them dead; the real replay moves
exactly those to pending and the relay then sends them (a dead row of another error code stays dead); the
backfill of the day they were sent counts them in its dry run, then succeeds and re-delivers every message
sent that day, its reason audited; a launch without a
filter or without a day ends FAILURE naming what was missing and touches nothing; a misspelt field starts no run.
"""

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from outbox_pipelines import Outbox
from outbox_pipelines_tests.drills.conftest import REPO, TABLE, DrillStack
from outbox_pipelines_tests.rows import make_dead

pytestmark = [
    pytest.mark.drill,
    # dagster_graphql's client calls gql's execute() the way gql 4 deprecates: theirs, not ours.
    pytest.mark.filterwarnings("ignore:Using variable_values and operation_name:DeprecationWarning"),
]

DOC = REPO / "docs" / "deploy.md"
SECTION = "## Launching replay and backfill from code (GraphQL)"
DEAD = 3  # rows dead of BROKER_5XX: the doc's filter matches them
WARM = 4  # orders sent before the drill: the backfill re-delivers them too
RUN = "query ($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status tags { key value } } } }"
RUNS = "{ runsOrError { __typename ... on Runs { results { runId jobName status } } } }"


def doc_blocks() -> list[str]:
    """The section's ```python blocks, in order."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:] if end == -1 else text[start:end]
    return re.findall(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)


def with_values(code: str, **values: Any) -> str:
    """``code`` with the line ``NAME = ...`` of each value replaced (each must be there exactly once)."""
    for name, value in values.items():
        code, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", code, flags=re.MULTILINE)
        assert n == 1, f"the doc's example has {n} assignments of {name}, expected one"
    return code


def run_tags(stack: DrillStack, run_id: str) -> dict[str, str]:
    run = stack.dev.graphql(RUN, {"id": run_id})["runOrError"]
    assert run["__typename"] == "Run", run
    return {tag["key"]: tag["value"] for tag in run["tags"]}


def by_status(stack: DrillStack, ids: list[int]) -> dict[str, int]:
    return stack.statuses("id = ANY(%s)", (ids,))


@pytest.mark.timeout(600)
def test_the_documented_graphql_launches_replay_and_backfill_against_dev(stack: DrillStack) -> None:
    started = datetime.now(UTC)
    blocks = doc_blocks()
    assert len(blocks) == 4, (
        f"{SECTION!r} should have 4 python blocks (helpers, replay, backfill, refused): found {len(blocks)}"
    )
    helpers, replay, backfill, refused = blocks

    stack.enqueue(stack.orders("graphql-warm", WARM))
    stack.wait_sent("graphql-warm", WARM, timeout_s=120)
    outbox = Outbox(TABLE)
    with stack.connect(autocommit=False) as conn:  # dead in the transaction that enqueues them: never pending
        dead = [r.id for r in outbox.enqueue_many(conn, stack.orders("graphql-dead", DEAD), outside_transaction=True)]
        [other] = [
            r.id for r in outbox.enqueue_many(conn, stack.orders("graphql-unauthorized", 1), outside_transaction=True)
        ]
        make_dead(conn, TABLE, dead, code="BROKER_5XX")
        make_dead(conn, TABLE, other, code="UNAUTHORIZED")
        conn.commit()
    assert by_status(stack, [*dead, other]) == {"dead": DEAD + 1}

    namespace: dict[str, Any] = {"__name__": "deploy_md_example"}
    exec(with_values(helpers, HOST="127.0.0.1", PORT=stack.dev.port), namespace)  # the doc's code
    assert namespace["LOCATION"] == "outbox_pipelines.definitions" and namespace["TABLE"] == TABLE

    # the dry run, then the real replay: the doc's block as written
    exec(replay, namespace)
    dry, real = namespace["dry"], namespace["real"]
    assert namespace["dry_status"] == "SUCCESS" and namespace["real_status"] == "SUCCESS"
    assert dry["dry_run"] is True and dry["would_replay"] == DEAD and dry["replayed"] == 0, dry
    assert sorted(dry["replayed_ids"]) == sorted(dead), dry
    assert dry["by_error_code"] == {"BROKER_5XX": DEAD}, dry
    assert run_tags(stack, namespace["dry_id"]).get("outbox/dry_run") == "true"
    assert real["dry_run"] is False and real["replayed"] == DEAD, real
    assert sorted(real["replayed_ids"]) == sorted(dead), real
    assert run_tags(stack, namespace["real_id"]).get("outbox/dry_run") == "false"
    # the dry run left them dead (else the real run would have matched none); the relay sends them now
    stack.wait_sent("graphql-dead", DEAD, timeout_s=120)
    assert by_status(stack, [other]) == {"dead": 1}, "a row the filter does not name stayed dead"
    audited = stack.scalar(
        "SELECT count(*) FROM outbox_audit WHERE outbox_table = %s AND code = 'outbox_replay' AND message_id = ANY(%s)",
        (TABLE, dead),
    )
    assert audited == DEAD

    # the backfill of the day they were sent: every message sent that day, re-delivered
    day = stack.scalar(
        f"SELECT min(published_at AT TIME ZONE 'UTC')::date::text FROM {TABLE} WHERE id = ANY(%s)", (dead,)
    )
    sent_that_day = stack.scalar(
        f"SELECT count(*) FROM {TABLE} WHERE status = 'sent' AND (published_at AT TIME ZONE 'UTC')::date = %s::date",
        (day,),
    )
    assert sent_that_day >= WARM + DEAD
    namespace["DAY"] = day  # the block reads DAY from the helpers' block: give it the day the rows were sent
    exec(backfill, namespace)
    would = namespace["would"]  # the dry run first: counted, delivered nothing
    assert namespace["would_status"] == "SUCCESS" and would["dry_run"] is True, would
    assert would["found"] == sent_that_day and sum(would["by_topic"].values()) == sent_that_day, would
    assert len(would["first_event_ids"]) == min(20, sent_that_day), would
    result = namespace["backfilled"]
    assert namespace["backfill_status"] == "SUCCESS", result
    assert result["day"] == day and result["found"] == sent_that_day, result
    assert result["delivered"] == sent_that_day and result["failed"] == 0, result
    assert run_tags(stack, namespace["backfill_id"]).get("dagster/partition") == day
    [detail] = [
        row["detail"]
        for row in stack.query(
            "SELECT detail FROM outbox_audit WHERE outbox_table = %s AND code = 'outbox_backfill' AND created_at >= %s",
            (TABLE, started),
        )
    ]
    assert detail.endswith("(billing lost a day of orders (INC-1234))"), detail

    # refused launches: each ends FAILURE naming what was missing, or starts no run; nothing moves
    before = stack.statuses()
    exec(refused, namespace)
    no_filter, no_day = namespace["refused"], namespace["no_day"]
    assert "filter" in no_filter["error"] and "all: true" in no_filter["error"], no_filter
    assert "partition" in no_day["error"], no_day
    assert namespace["kind"] == "RunConfigValidationInvalid", namespace["errors"]
    assert any("idz" in error["message"] for error in namespace["errors"]), namespace["errors"]
    assert stack.statuses() == before, "a refused launch changed rows"
    runs = [
        r
        for r in stack.dev.graphql(RUNS)["runsOrError"]["results"]
        if r["jobName"] in ("replay_dead_job", "backfill_job")
    ]
    assert sorted(r["status"] for r in runs) == ["FAILURE"] * 2 + ["SUCCESS"] * 4, runs
