"""Soak (issue 23): 50 module tables under `outbox-pipelines dev` with its defaults, as a platform team runs it.

The adopter's stack of the drills (drills/many_tables.py) at full scale: 50 tables sending to a webhook,
plus an unimportable handlers module, an invalid section and a destination that is down. Three bursts
of 50 messages into every table, a minute apart: each drains within 60 s of its commit, each message is
delivered once, the Dagster processes under dev stay under 1.5 GB resident, and the relay runs are one
group run (two at a hand-off), not 50. Figures: the drain time per burst, the resident memory and
process count under dev, appended to $OUTBOX_SOAK_RESULTS.
"""

import time

import pytest

from outbox_pipelines_tests.drills.many_tables import GIB, RUNS, ManyTablesStack
from outbox_pipelines_tests.helpers import wait_until
from outbox_pipelines_tests.soak.conftest import record

pytestmark = pytest.mark.soak
TABLES = 50
PER_TABLE = 50


@pytest.mark.timeout(1200)
def test_fifty_tables_drain_within_a_minute_each_with_one_group_run(pg_server) -> None:
    stack = ManyTablesStack(pg_server, TABLES)
    figures: dict = {"soak": "fifty_tables", "tables": TABLES, "per_table": PER_TABLE, "bursts": []}
    try:
        figures["dev_ready_s"] = round(stack.start(), 1)
        for burst in range(3):
            prefix = f"b{burst}"
            committed = stack.enqueue_everywhere(PER_TABLE, prefix)
            wait_until(
                lambda prefix=prefix: all(stack.sent_in(t, prefix) == PER_TABLE for t in stack.tables),
                180,
                f"burst {burst} drained",
                interval_s=0.25,
                on_timeout=stack.diagnostics,
            )
            seconds = time.monotonic() - committed
            rss, processes = stack.rss_bytes()
            figures["bursts"].append(
                {"drain_s": round(seconds, 1), "rss_gib": round(rss / GIB, 2), "processes": processes}
            )
            assert seconds <= 60, f"burst {burst} drained in {seconds:.1f} s"
            assert rss <= 1.5 * GIB, f"{rss / GIB:.2f} GiB under dev"
            time.sleep(60)
        keys = [n for key, n in stack.sink.counts.items() if key[:2] in ("b0", "b1", "b2")]
        assert len(keys) == 3 * TABLES * PER_TABLE and set(keys) == {1}, "each message delivered once"
        runs = stack.graphql(RUNS, {"filter": {"tags": [{"key": "outbox/kind", "value": "relay"}]}})
        figures["relay_runs"] = len(runs["runsOrError"]["results"])
        assert figures["relay_runs"] <= 2
    finally:
        record(figures)
        stack.close()
