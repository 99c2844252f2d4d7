"""Issue 25, "alerts that do not clear", against a running `outbox-pipelines dev` (the drill stack, conftest.py).

A low-volume table (outbox_orders, relayed by dev's own relay group run to broker-sim), in file order:

- an order that died days ago is replayed (`outbox-pipelines replay --id`, the core's replay that
  replay_dead_job runs too): dev's relay delivers it and the lag check neither fails nor alerts (the message
  used to count as days late);
- the receiver is down for 20 s (past the table's 10 s lag warning, as the issue's 70 s outage was past the
  default 60 s) while a few orders wait; once they are delivered and nothing waits, the lag
  check passes (it used to grade the last hour's deliveries, and stayed red for up to an hour with
  "0 waiting. Check that a relay run is active").

The lag check is read as on-call meets it: outbox_checks_job launched through dev's GraphQL (the catalog
drill's run_checks_job), its lag evaluation read back by run, and the alerts the outbox_oncall sensor posts
to the stack's webhook.
"""

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from outbox_pipelines import Outbox
from outbox_pipelines_tests.drills.conftest import CLI, TABLE, DrillStack, running_stack, wait_until
from outbox_pipelines_tests.drills.test_catalog_health import run_checks_job
from outbox_pipelines_tests.drills.test_oncall_drills import check_shape, is_check
from outbox_pipelines_tests.scratch import DEMO_PARTS

pytestmark = pytest.mark.drill

# The deployment's lag thresholds for outbox_orders, tightened so that an outage of OUTAGE_S makes the
# old rule fail just as the 70 s outage did against the 60 s default (at a third of the drill's time).
LAG_WARN_S = 10.0
OUTAGE_S = 20.0
SWEEP_S = 15.0  # the outbox_oncall sensor's interval (defs/oncall_sensor.py)
ONCALL_SENSOR = "outbox_oncall"
SENSOR_TICKS = """{ repositoriesOrError { ... on RepositoryConnection { nodes {
  sensors { name sensorState { ticks(limit: 5) { timestamp status } } } } } } }"""
LAG_CHECK = """
query($key: AssetKeyInput!) {
  assetCheckExecutions(assetKey: $key, checkName: "lag", limit: 20) {
    runId status
    evaluation {
      success severity description
      metadataEntries { label ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue } }
    }
  }
}"""


@pytest.fixture(scope="module")
def drill_stack(pg_server: Any) -> Iterator[DrillStack]:
    """The drill stack, its outbox_orders warning on lag at LAG_WARN_S (an outbox.toml of the deployment)."""

    def configure(stack: DrillStack) -> None:
        config = stack.tmp / "outbox.toml"
        config.write_text(
            DEMO_PARTS
            + f'[tables.outbox_orders]\nlag_p95_warn = "{LAG_WARN_S:.0f}s"\noldest_pending_warn = "{LAG_WARN_S:.0f}s"\n'
        )
        stack.dev_env["OUTBOX_CONFIG"] = str(config)

    with running_stack(pg_server, configure) as stack:
        yield stack


def lag_check(stack: DrillStack) -> dict[str, Any]:
    """The lag check of outbox_orders, evaluated now by an outbox_checks_job run: passed, severity,
    description and its figures."""
    run_id = run_checks_job(stack)
    executions = stack.dev.graphql(LAG_CHECK, {"key": {"path": ["outbox", TABLE]}})["assetCheckExecutions"]
    [evaluation] = [e["evaluation"] for e in executions if e["runId"] == run_id]
    figures = {m["label"]: m.get("floatValue", m.get("intValue")) for m in evaluation["metadataEntries"]}
    return {
        "passed": evaluation["success"],
        "severity": evaluation["severity"],
        "description": evaluation["description"],
        "figures": figures,
    }


def wait_for_sweeps(stack: DrillStack, sweeps: int) -> None:
    """Until ``sweeps`` ticks of the on-call sensor begun from now have ended, its alerts posted (Dagster's ticks,
    read through dev's GraphQL, rather than the clock: a tick comes late on busy cores)."""
    since = time.time()

    def swept() -> bool:
        nodes = stack.dev.graphql(SENSOR_TICKS)["repositoriesOrError"]["nodes"]
        ticks = [
            tick
            for node in nodes
            for sensor in node["sensors"]
            if sensor["name"] == ONCALL_SENSOR
            for tick in sensor["sensorState"]["ticks"]
        ]
        return sum(tick["timestamp"] > since and tick["status"] in ("SUCCESS", "SKIPPED") for tick in ticks) >= sweeps

    wait_until(swept, sweeps * SWEEP_S * 4, f"{sweeps} ticks of {ONCALL_SENSOR} begun after {since:.0f}", interval_s=1)


def lag_alerts(stack: DrillStack, since: float, status: str = "firing") -> list[Any]:
    return [a for a in stack.receiver.alerts_since(since) if is_check(a, "lag", status)]


@pytest.mark.timeout(600)
def test_replaying_an_old_dead_order_does_not_fail_the_lag_check(stack: DrillStack) -> None:
    stack.enqueue(stack.orders("steady", 5))
    stack.wait_sent("steady", 5, timeout_s=240)  # dev's relay group run is up and delivering
    # An order that died two days ago, created three days ago (written dead in one transaction: no relay saw it).
    [message] = stack.orders("old-dead", 1)
    with stack.connect(autocommit=False) as conn:
        [row] = Outbox(TABLE).enqueue_many(conn, [message], outside_transaction=True)
        conn.execute(
            f"UPDATE {TABLE} SET status = 'dead', attempts = 6, last_error_code = 'BROKER_5XX', "
            "last_error = 'HTTP 503 from the broker', created_at = now() - interval '3 days', "
            "available_at = now() - interval '2 days 1 hour', updated_at = now() - interval '2 days' "
            "WHERE id = %s",
            (row.id,),
        )
        conn.commit()
    before = lag_check(stack)
    assert before["passed"], before

    t0 = time.monotonic()
    replay = subprocess.run(
        [CLI, "replay", "--table", TABLE, "--id", str(row.id), "--json"],
        env=stack.dev_env,
        cwd=stack.tmp,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["replayed"] == 1, replay.stdout
    stack.wait_sent("old-dead", 1, timeout_s=120)
    sent = stack.query(f"SELECT published_at - created_at AS took FROM {TABLE} WHERE id = %s", (row.id,))[0]
    assert sent["took"].days >= 3  # created → delivered: three days, in the last hour's deliveries now

    after = lag_check(stack)
    assert after["passed"], f"lag failed after the replay of one old dead order: {after}"
    assert after["figures"]["waiting_now"] == 0, after
    assert after["figures"]["lag_p95_s"] > 86400, after  # the figure the check used to grade
    wait_for_sweeps(stack, 2)  # the on-call sensor sweeps the table twice more
    fired = lag_alerts(stack, t0)
    assert not fired, f"the replay raised a lag alert:\n{stack.alert_lines(fired)}"


@pytest.mark.timeout(600)
def test_after_a_receiver_outage_the_lag_check_passes_once_nothing_waits(stack: DrillStack) -> None:
    stack.enqueue(stack.orders("before-outage", 5))
    stack.wait_sent("before-outage", 5, timeout_s=240)

    t0 = time.monotonic()
    stack.broker.stop()
    try:
        stack.enqueue(stack.orders("outage", 4))
        time.sleep(max(0.0, t0 + OUTAGE_S - time.monotonic()))
    finally:
        stack.broker.start()
    stack.wait_sent("outage", 4, timeout_s=300)
    t_drained = time.monotonic()
    waited = stack.scalar(
        f"SELECT extract(epoch FROM max(published_at - created_at)) FROM {TABLE} WHERE event_id LIKE %s",
        (f"drill-{stack.token}-outage-%",),
    )
    assert waited >= LAG_WARN_S, f"the outage orders waited only {waited:.0f} s: no outage to recover from"

    lag = lag_check(stack)
    assert lag["passed"], f"lag failed with nothing waiting after the outage: {lag}"
    assert lag["figures"]["waiting_now"] == 0 and lag["figures"]["lag_now_s"] == 0, lag
    assert "nothing waiting" in lag["description"] and "relay run is active" not in lag["description"], lag
    # What the check used to grade: created → delivered over the last hour, the outage's orders among them.
    assert lag["figures"]["lag_p95_s"] >= LAG_WARN_S, lag

    # on-call: a lag alert of the outage (if the sweep caught one) is resolved, and none fires after the drain
    wait_for_sweeps(stack, 2)  # the on-call sensor sweeps the table twice more
    for fired in lag_alerts(stack, t0):
        check_shape(stack, fired)
        key = fired.body["alert_key"]
        stack.receiver.wait_for(
            lambda a, key=key: a.get("alert_key") == key and a.get("status") == "resolved",
            since=fired.at,
            timeout_s=60,
            what=f"'resolved' for {key} after the drain",
        )
    assert not [a for a in lag_alerts(stack, t_drained) if not a.get("reminder")], stack.alert_lines(
        lag_alerts(stack, t_drained)
    )
