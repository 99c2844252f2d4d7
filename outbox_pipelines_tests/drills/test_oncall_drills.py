"""On-call drills: inject a fault into a live stack, time the first alert, check the system recovers.

The stack (conftest.py) is `outbox-pipelines dev` + `outbox-pipelines broker-sim` + a
webhook receiver on one fresh database. Each drill measures the seconds from the
fault to the first matching alert and, when OUTBOX_DRILL_RESULTS names a file,
appends ``{"drill": name, "seconds": s}`` to it (JSON lines; bench/drills.py reads it).

The alert contract checked here: JSON with ``status`` (firing | resolved), ``severity``
(warning | error), ``kind`` (check | run_failure | relay_died), ``table``, ``check``
(kind check: lag | dead_letters | stuck | backlog | destination), ``job``/``run_id``
(run alerts), ``summary``, ``text``, ``figures``, ``started_at`` (ISO 8601), ``link``
(under OUTBOX_UI_URL), ``alert_key``; optional ``reminder: true``.

The tests run in file order and share the stack; the last one looks at every alert
of the module. Run: ``pytest -m drill outbox_pipelines_tests/drills -q`` (~15 min).
"""

import dataclasses
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from outbox_pipelines import Outbox
from outbox_pipelines_tests.drills.conftest import (
    ALERT_FIELDS,
    ALERT_KINDS,
    ALERT_SEVERITIES,
    ALERT_STATUSES,
    CHECK_NAMES,
    FAILED_RUNS_QUERY,
    RUN_QUERY,
    TABLE,
    Alert,
    DrillStack,
    outage_seconds,
    parse_time,
    port_open,
    wait_until,
)

pytestmark = pytest.mark.drill


def is_check(alert: Alert, check: str, status: str = "firing", table_name: str = TABLE) -> bool:
    return (
        alert.get("kind") == "check"
        and alert.get("check") == check
        and alert.get("status") == status
        and alert.get("table") == table_name
    )


def assert_alert_shape(alert: Alert) -> None:
    """The contract fields of one alert (used on every alert a drill waits for, and on all at the end)."""
    body = alert.body
    assert isinstance(body, dict), f"alert is not a JSON object: {body!r}"
    missing = [f for f in ALERT_FIELDS if f not in body]
    assert not missing, f"alert lacks {missing}: {body}"
    assert body["status"] in ALERT_STATUSES, body
    assert body["severity"] in ALERT_SEVERITIES, body
    assert body["kind"] in ALERT_KINDS, body
    if body["kind"] == "check":
        assert body.get("check") in CHECK_NAMES, body
    else:
        assert body.get("job") and body.get("run_id"), f"run alert without job/run_id: {body}"
    assert isinstance(body["figures"], dict), body
    assert isinstance(body["summary"], str) and body["summary"], body
    assert isinstance(body["text"], str) and body["text"], body
    parse_time(body["started_at"])


def check_shape(stack: DrillStack, alert: Alert) -> None:
    assert_alert_shape(alert)
    assert str(alert.body["link"]).startswith(stack.ui_url), f"link not under {stack.ui_url}: {alert.body['link']}"


class OrderStream:
    """A steady trickle of orders from a thread (``rate`` per second) until stopped."""

    def __init__(self, stack: DrillStack, prefix: str, rate: float) -> None:
        self.stack, self.prefix, self.rate = stack, prefix, rate
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"drill-stream-{prefix}", daemon=True)

    def _run(self) -> None:
        outbox = Outbox(TABLE)
        try:
            with self.stack.connect(autocommit=False) as conn:
                while not self._stop.is_set():
                    outbox.enqueue_many(
                        conn, self.stack.orders(self.prefix, 1, start=self.sent), outside_transaction=True
                    )
                    conn.commit()
                    self.sent += 1
                    self._stop.wait(1.0 / self.rate)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> "OrderStream":
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the order stream failed: {self.error!r}")
        return self.sent

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# -- 0. the stack is warm: a Dagster relay run delivers to the broker -------------------------------
@pytest.mark.timeout(420)
def test_stack_warm(stack: DrillStack) -> None:
    """Not a drill: the harness works, and the stack relays through Dagster end to end before anything is timed."""
    # the webhook receiver keeps what is posted to it (self-test posts are not alerts)
    answer = httpx.post(stack.receiver.base + "/selftest", json={"hello": "drills"}, timeout=5, trust_env=False)
    assert answer.status_code == 200
    assert any(a.path == "/selftest" and a.body == {"hello": "drills"} for a in stack.receiver.received)
    assert all(a.path != "/selftest" for a in stack.receiver.alerts)
    # the broker simulator comes back on the same port
    port = stack.broker.port
    stack.broker.stop()
    assert not port_open(port)
    stack.broker.start()
    assert stack.broker.running and port_open(port)
    stack.enqueue(stack.orders("warm", 5))
    stack.wait_sent("warm", 5, timeout_s=180)


# -- 1. poison order → dead-letter alert -------------------------------------------------------------
@pytest.mark.timeout(300)
def test_poison_order_raises_dead_letter_alert(stack: DrillStack) -> None:
    dead_before = stack.statuses().get("dead", 0)
    # The broker-facing Idempotency-Key is the row's event_id; broker-sim answers 400 to this one.
    poison = dataclasses.replace(stack.orders("poison", 1)[0], event_id=stack.poison_key)
    t0 = stack.enqueue([poison, *stack.orders("beside-poison", 3)])

    alert = stack.receiver.wait_for(
        lambda a: is_check(a, "dead_letters"),
        since=t0,
        timeout_s=120,
        what="check 'dead_letters' firing for outbox_orders",
    )
    seconds = alert.at - t0
    stack.record("poison_order.dead_letters", seconds)
    check_shape(stack, alert)
    assert seconds <= 120
    assert stack.statuses().get("dead", 0) == dead_before + 1
    stack.wait_sent("beside-poison", 3, timeout_s=60)


# -- 2. broker down a minute (3 in bench/drills.py) → destination alert while down, resolved after, nothing dead
@pytest.mark.timeout(720)
def test_broker_outage_alerts_then_resolves(stack: DrillStack) -> None:
    outage_s, n = outage_seconds(), 300  # at least until the alert has fired (below)
    dead_before = stack.statuses().get("dead", 0)
    t0 = time.monotonic()
    stack.broker.stop()
    try:
        stack.enqueue(stack.orders("outage", n))
        alert = stack.receiver.wait_for(
            lambda a: is_check(a, "destination"),
            since=t0,
            timeout_s=120,
            what="check 'destination' firing for outbox_orders during the outage",
        )
        seconds = alert.at - t0
        stack.record("broker_down.destination", seconds)
        assert not stack.broker.running and seconds <= 120
        check_shape(stack, alert)
        figures = alert.body["figures"]
        assert "waiting" in figures and "error_codes" in figures, f"destination figures: {figures}"
        time.sleep(max(0.0, t0 + outage_s - time.monotonic()))
    finally:
        stack.broker.start()
    t1 = time.monotonic()

    key = alert.body["alert_key"]
    resolved = stack.receiver.wait_for(
        lambda a: a.get("alert_key") == key and a.get("status") == "resolved",
        since=t1,
        timeout_s=300,
        what=f"'resolved' for {key} after the broker came back",
    )
    stack.record("broker_down.resolved_after_restore", resolved.at - t1)
    check_shape(stack, resolved)
    stack.wait_sent("outage", n, timeout_s=300)
    assert stack.statuses().get("dead", 0) == dead_before, "the outage killed messages"
    firing_during = [
        a
        for a in stack.receiver.alerts_since(t0)
        if a.get("alert_key") == key and a.get("status") == "firing" and not a.get("reminder")
    ]
    assert len(firing_during) == 1, f"destination alert fired {len(firing_during)} times for one outage"


# -- 3. SIGKILL of a relay run → relay_died alert, rows back to pending ---------------------------
@pytest.mark.timeout(420)
def test_killed_relay_run_alerts_and_releases_rows(stack: DrillStack) -> None:
    # Every 3rd broker request takes 2 s (inside the IOC timeout of 2.5 s), so a relay holds rows.
    stack.broker.restart(["--every-nth-timeout", "3", "--hang", "2"])
    try:
        with OrderStream(stack, "kill-stream", rate=20) as stream:
            found: dict[str, Any] = {}

            def holding_worker() -> bool:
                rows = stack.query(
                    f"""SELECT w.worker, w.run_id, w.pid,
                               (SELECT count(*) FROM {TABLE} o
                                 WHERE o.status = 'sending' AND o.locked_by = w.worker) AS held
                          FROM outbox_relay_workers w
                         WHERE w.table_name = %s AND w.run_id IS NOT NULL AND w.stopped_at IS NULL
                           AND w.heartbeat_at > now() - interval '15 seconds'
                         ORDER BY held DESC, w.heartbeat_at DESC LIMIT 1""",
                    (TABLE,),
                )
                if rows and rows[0]["held"] > 0:
                    found.update(rows[0])
                    return True
                return False

            wait_until(
                holding_worker,
                120,
                "a live Dagster relay run of outbox_orders in outbox_relay_workers "
                "(run_id set, not stopped, fresh heartbeat) holding rows in 'sending'",
            )
            worker, run_id, pid = found["worker"], found["run_id"], found["pid"]
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)

            alert = stack.receiver.wait_for(
                lambda a: a.get("kind") == "relay_died" and a.get("table") == TABLE,
                since=t0,
                timeout_s=60,
                what="kind 'relay_died' for outbox_orders",
            )
            seconds = alert.at - t0
            stack.record("relay_sigkill.relay_died", seconds)
            check_shape(stack, alert)
            assert alert.body["run_id"] == run_id, f"relay_died names run {alert.body['run_id']}, killed {run_id}"
            figures = alert.body["figures"]
            assert "held" in figures and "ran_s" in figures, f"relay_died figures: {figures}"

            wait_until(
                lambda: (
                    stack.scalar(f"SELECT count(*) FROM {TABLE} WHERE status = 'sending' AND locked_by = %s", (worker,))
                    == 0
                ),
                30,
                f"no rows of {TABLE} left in 'sending' held by the killed worker {worker}",
            )

            def run_failed() -> bool:
                return stack.dev.graphql(RUN_QUERY, {"runId": run_id})["runOrError"].get("status") == "FAILURE"

            wait_until(run_failed, 60, f"Dagster to mark the killed run {run_id} FAILURE", interval_s=2)
            streamed = stream.stop()
        stack.wait_sent("kill-stream", streamed, timeout_s=180)
    finally:
        stack.broker.restart()


# -- 4. 30,000 orders at once → backlog alert, drain, resolved ---------------------------------
@pytest.mark.timeout(720)
def test_burst_of_30k_orders_alerts_backlog_then_drains(stack: DrillStack) -> None:
    # The broker answers every order in 150 ms, as a real one over a network would. (The simulator's
    # sub-millisecond answers let the relay drain 30,000 orders in ~15 s: gone before the ~15 s
    # evaluation sees them, so no backlog to alert on.) At 150 ms the table stays above the
    # 10,000 threshold for about a minute. Once the alert has fired the broker answers at full
    # speed again (as after a scale-up): the drain and the 'resolved' are what is left to see,
    # and at 150 ms they took three more minutes of CI.
    stack.broker.restart(["--every-nth-timeout", "1", "--hang", "0.15"])
    try:
        n = 30_000
        t_start = time.monotonic()
        t0 = stack.enqueue(stack.orders("burst", n), batch=1000)  # one transaction: 30,000 ready at once
        enqueue_s = t0 - t_start

        alert = stack.receiver.wait_for(
            lambda a: is_check(a, "backlog"),
            since=t_start,
            timeout_s=120,
            what=f"check 'backlog' firing for outbox_orders (enqueue took {enqueue_s:.1f} s)",
        )
        stack.record("burst_30k.backlog", alert.at - t0)
        check_shape(stack, alert)
        assert stack.broker.set_faults(every_nth_timeout=0)["every_nth_timeout"] == 0
        t_fast = time.monotonic()

        stack.wait_sent("burst", n, timeout_s=300)
        stack.record("burst_30k.drained_at_full_speed", time.monotonic() - t_fast)
        key = alert.body["alert_key"]
        resolved = stack.receiver.wait_for(
            lambda a: a.get("alert_key") == key and a.get("status") == "resolved",
            since=alert.at,
            timeout_s=120,
            what=f"'resolved' for {key} after the drain",
        )
        check_shape(stack, resolved)
    finally:
        stack.broker.restart()


# -- 5. clean restart → no run_failure, no relay_died, no failed run --------------------------
def failed_run_ids(stack: DrillStack) -> set[str]:
    answer = stack.dev.graphql(FAILED_RUNS_QUERY)["runsOrError"]
    assert answer["__typename"] == "Runs", answer
    return {r["runId"] for r in answer["results"]}


@pytest.mark.timeout(420)
def test_clean_restart_is_silent(stack: DrillStack) -> None:
    with OrderStream(stack, "restart-stream", rate=5) as stream:
        time.sleep(5)  # relay runs are busy when the stop comes
        failed_before = failed_run_ids(stack)
        t0 = time.monotonic()
        code = stack.dev.stop(signal.SIGINT, grace_s=90)
        stop_s = time.monotonic() - t0
        assert code is not None, "outbox-pipelines dev did not exit within 90 s of SIGINT"
        assert code == 0, f"outbox-pipelines dev exited with {code} after SIGINT"
        time.sleep(2)
        left = stack.dev.leftovers()
        assert not left, f"processes still running after dev exited: {left}"
        stack.dev.start()
        stack.dev.wait_ready(timeout_s=240)
        t_up = time.monotonic()
        stack.record("clean_restart.downtime", t_up - t0)
        time.sleep(60)
        streamed = stream.stop()

    noisy = [a for a in stack.receiver.alerts_since(t0) if a.get("kind") in ("run_failure", "relay_died")]
    assert not noisy, f"a clean restart (stopped in {stop_s:.0f} s) alerted:\n{stack.alert_lines(noisy)}"
    new_failures = failed_run_ids(stack) - failed_before
    assert not new_failures, f"runs in FAILURE after the clean restart: {sorted(new_failures)}"
    stack.wait_sent("restart-stream", streamed, timeout_s=120)


@pytest.mark.timeout(420)
def test_dev_started_as_a_background_job_of_a_script_stops_promptly_on_sigint(stack: DrillStack) -> None:
    """`outbox-pipelines dev &` in a script starts with SIGINT ignored (POSIX shells do that to a
    script's background jobs); a SIGINT must still stop it, and its Dagster processes, within seconds.
    Before the fix dagster dev inherited the ignored SIGINT: dev waited 30 s for it, then stopped the
    group by SIGTERM and SIGKILL, 48 s in all."""
    stack.dev.stop(signal.SIGTERM, grace_s=60)
    stack.dev.start(sigint_ignored=True)
    stack.dev.wait_ready(timeout_s=240)
    t0 = time.monotonic()
    code = stack.dev.stop(signal.SIGINT, grace_s=90)
    stop_s = time.monotonic() - t0
    assert code == 0, f"outbox-pipelines dev exited with {code} after SIGINT (None: still running after 90 s)"
    assert stop_s < 30, f"outbox-pipelines dev took {stop_s:.0f} s to stop after SIGINT (about 8 s when idle)"
    time.sleep(2)
    left = stack.dev.leftovers()
    assert not left, f"processes still running after dev exited: {left}"


# -- 6. across the module: one firing per condition, every alert in contract ----------------------
@pytest.mark.timeout(120)
def test_zz_no_duplicate_alerts_and_all_in_contract(drill_stack: DrillStack) -> None:
    alerts = drill_stack.receiver.alerts
    seen: dict[str, Alert] = {}
    duplicates = []
    for alert in alerts:
        if alert.get("status") != "firing" or alert.get("reminder") is True:
            continue
        text = alert.get("text")
        if text in seen:
            duplicates.append((seen[text], alert))
        else:
            seen[text] = alert
    assert not duplicates, "the same firing alert was sent twice without reminder: true:\n" + "\n\n".join(
        drill_stack.alert_lines([a, b]) for a, b in duplicates
    )
    bad = []
    for alert in alerts:
        try:
            check_shape(drill_stack, alert)
        except AssertionError as exc:
            bad.append(str(exc))
    assert not bad, f"{len(bad)} of {len(alerts)} alerts break the contract:\n" + "\n".join(bad[:20])
