"""Two 10-minute destination faults, run side by side (each on its own PostgreSQL, broker and relays).

- **Broker outage**: the broker simulator is stopped (connection refused) with a few thousand
  orders waiting, and started again on the same port after 600 s. The promise: the table's
  circuit opens (``outbox_destination_health.circuit_opened_at``) after ``circuit_threshold``
  failures in a row, one probe every ``probe_interval`` (10 s) and no attempts spent while it
  is open, so nothing dies; the first probe that succeeds closes it and everything goes out:
  delivery resumes within 15 s of the broker's return (broker listening -> its first 201).
- **429 storm**: the broker answers ``429 Retry-After: 1`` to every request for 600 s
  (``--every-nth-429 1 --retry-after 1``, switched off at runtime through ``POST /_faults``).
  The promise: throttling spends no attempt (attempts stay small, nothing dies), the pause is
  table-wide (every relay of the table holds off), and everything is sent after the storm.
  The figures say how many requests the relays made during the storm.

The two scenarios share the machine but nothing else; both run to the end before either's
assertions are checked, so one failing still reports the other's figures.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from outbox_pipelines_tests.helpers import wait_until
from outbox_pipelines_tests.soak.conftest import (
    ORDERS_MAX_ATTEMPTS,
    TABLE,
    SoakStack,
    record,
    scaled,
)

RELAYS = 2
BATCH = 100
RETRY_AFTER_S = 1.0
PROBE_INTERVAL_S = 10.0  # the table's default
RESUME_LIMIT_S = 15.0


def sample_table(stack: SoakStack) -> dict[str, Any]:
    row = stack.db.query(
        f"SELECT count(*) FILTER (WHERE status = 'dead') AS dead, coalesce(max(attempts), 0) AS max_attempts, "
        f"count(*) FILTER (WHERE status = 'sent') AS sent FROM {TABLE}"
    )[0]
    health = stack.db.query(
        "SELECT circuit_opened_at, paused_until, consecutive_failures FROM outbox_destination_health "
        "WHERE table_name = %s",
        (TABLE,),
    )
    return {
        **row,
        **(health[0] if health else {"circuit_opened_at": None, "paused_until": None, "consecutive_failures": 0}),
    }


def claims_between(stack: SoakStack, since_wall: float, until_wall: float) -> int:
    return stack.db.scalar(
        "SELECT count(*) FROM outbox_audit WHERE outbox_table = %s AND code = 'outbox_claim' "
        "AND created_at >= to_timestamp(%s) AND created_at < to_timestamp(%s)",
        (TABLE, since_wall, until_wall),
    )


def claim_batches_between(stack: SoakStack, since_wall: float, until_wall: float) -> int:
    """Claim statements (one per batch: same worker, same instant)."""
    return stack.db.scalar(
        "SELECT count(DISTINCT (worker, created_at)) FROM outbox_audit WHERE outbox_table = %s "
        "AND code = 'outbox_claim' AND created_at >= to_timestamp(%s) AND created_at < to_timestamp(%s)",
        (TABLE, since_wall, until_wall),
    )


def finish(stack: SoakStack, figures: dict[str, Any], keys: list[str]) -> dict[str, int | None]:
    """Stop the relays (SIGTERM), add the end-state figures; the relays' exit codes."""
    exit_codes = {relay.name: relay.stop(grace_s=30) for relay in stack.relays.values()}
    found = stack.db.statuses()
    assert stack.broker is not None
    stats = stack.broker.stats()
    executed = stack.broker.executed_keys()
    figures.update(
        lost=len(keys) - found.get("sent", 0),
        lost_at_broker=len(set(keys) - executed),
        dead=found.get("dead", 0),
        executed_twice=stats["answers"].get("201", 0) - stats["executed"],
        duplicate_deliveries=stats["repeats"],
        left_in_sending=found.get("sending", 0),
        max_attempts=stack.db.scalar(f"SELECT coalesce(max(attempts), 0) FROM {TABLE}"),
        exit_codes_on_sigterm=sorted(set(exit_codes.values()), key=str),
    )
    return exit_codes


def broker_outage(stack: SoakStack, n: int, outage_s: float) -> dict[str, Any]:
    broker = stack.start_broker()
    stack.configure_relays(OUTBOX_BATCH_SIZE=str(BATCH))
    for slot in range(RELAYS):
        stack.start_relay(slot)
    broker.stop()  # connection refused from now on
    fault_started, fault_started_wall = time.monotonic(), time.time()
    keys = stack.db.enqueue_orders("outage", n)
    circuit_seen_open_after: float | None = None
    max_attempts_during = dead_during = 0
    while time.monotonic() < fault_started + outage_s:
        sample = sample_table(stack)
        if sample["circuit_opened_at"] is not None and circuit_seen_open_after is None:
            circuit_seen_open_after = time.monotonic() - fault_started
        max_attempts_during = max(max_attempts_during, sample["max_attempts"])
        dead_during = max(dead_during, sample["dead"])
        time.sleep(min(2.0, max(fault_started + outage_s - time.monotonic(), 0)))
    at_return = sample_table(stack)
    broker.start()  # the same port, a fresh broker
    back, back_wall = time.monotonic(), time.time()
    claims = claims_between(stack, fault_started_wall, back_wall)
    probe_batches = claim_batches_between(stack, fault_started_wall, back_wall)
    wait_until(
        lambda: set(stack.db.statuses()) <= {"sent", "dead"},
        300,
        "every order sent after the outage",
        on_timeout=stack.diagnostics,
    )
    drained = time.monotonic()
    stats = broker.stats()
    first_201 = stats["first_executed_at"]
    health_after = sample_table(stack)
    figures: dict[str, Any] = {
        "test": "broker_outage_10min",
        "messages": n,
        "duration_s": round(drained - fault_started, 1),
        "fault_s": round(back - fault_started, 1),
        "recovery_s": round(first_201 - back_wall, 1) if first_201 else None,
        "recovery_means": "broker listening again -> its first 201",
        "drain_after_return_s": round(drained - back, 1),
        "circuit_opened_after_s": round(circuit_seen_open_after, 1) if circuit_seen_open_after is not None else None,
        "circuit_open_at_return": at_return["circuit_opened_at"] is not None,
        "circuit_closed_after": health_after["circuit_opened_at"] is None,
        "consecutive_failures_at_return": at_return["consecutive_failures"],
        "claims_during_outage": claims,
        "claim_batches_during_outage": probe_batches,
        "max_attempts_during_outage": max_attempts_during,
        "dead_during_outage": dead_during,
    }
    exit_codes = finish(stack, figures, keys)
    figures["problems"] = problems = []
    if figures["lost"] or figures["lost_at_broker"]:
        problems.append(f"lost {figures['lost']} (not executed at the broker: {figures['lost_at_broker']})")
    if figures["dead"] or dead_during:
        problems.append(f"dead: {figures['dead']} (during the outage: {dead_during})")
    if figures["executed_twice"]:
        problems.append(f"executed twice: {figures['executed_twice']}")
    if figures["left_in_sending"]:
        problems.append(f"left in sending: {figures['left_in_sending']}")
    if circuit_seen_open_after is None:
        problems.append("the circuit never opened during the outage (circuit_opened_at stayed null)")
    if not figures["circuit_closed_after"]:
        problems.append("the circuit was still open after everything was sent")
    if max(max_attempts_during, figures["max_attempts"]) >= ORDERS_MAX_ATTEMPTS:
        problems.append(
            f"attempts burnt during the outage: max attempts {max_attempts_during} "
            f"(end {figures['max_attempts']}), the orders max is {ORDERS_MAX_ATTEMPTS}"
        )
    # One probe message every probe_interval while the circuit is open: what the relays had claimed
    # before it opened (a batch on the wire and one prefetched, per relay), then one row per probe.
    probes_allowed = int(outage_s / PROBE_INTERVAL_S) + 2
    if probe_batches > RELAYS * 2 + probes_allowed or claims > RELAYS * 2 * BATCH + probes_allowed:
        problems.append(
            f"the open circuit did not pace the probes: {claims} rows claimed in {probe_batches} "
            f"claims during a {outage_s:.0f} s outage (allowed: {RELAYS * 2} batches + "
            f"{probes_allowed} probes)"
        )
    if figures["recovery_s"] is None or figures["recovery_s"] > RESUME_LIMIT_S:
        problems.append(
            f"delivery resumed {figures['recovery_s']} s after the broker came back (limit {RESUME_LIMIT_S:.0f} s)"
        )
    if set(exit_codes.values()) != {0}:
        problems.append(f"relays did not stop cleanly on SIGTERM: {exit_codes}")
    return figures


def storm_429(stack: SoakStack, n: int, storm_s: float) -> dict[str, Any]:
    broker = stack.start_broker(["--every-nth-429", "1", "--retry-after", f"{RETRY_AFTER_S:g}"])
    stack.configure_relays(OUTBOX_BATCH_SIZE=str(BATCH))
    for slot in range(RELAYS):
        stack.start_relay(slot)
    keys = stack.db.enqueue_orders("storm", n)
    storm_started, storm_started_wall = time.monotonic(), time.time()
    before = broker.stats()
    max_attempts_during = dead_during = 0
    paused_seen = 0
    samples = 0
    while time.monotonic() < storm_started + storm_s:
        sample = sample_table(stack)
        samples += 1
        max_attempts_during = max(max_attempts_during, sample["max_attempts"])
        dead_during = max(dead_during, sample["dead"])
        paused_seen += sample["paused_until"] is not None
        time.sleep(min(2.0, max(storm_started + storm_s - time.monotonic(), 0)))
    during = broker.stats()
    broker.set_faults(every_nth_429=0)
    ended, ended_wall = time.monotonic(), time.time()
    claims = claims_between(stack, storm_started_wall, ended_wall)
    claim_batches = claim_batches_between(stack, storm_started_wall, ended_wall)
    wait_until(
        lambda: set(stack.db.statuses()) <= {"sent", "dead"},
        300,
        "every order sent after the storm",
        on_timeout=stack.diagnostics,
    )
    drained = time.monotonic()
    after = broker.stats()
    storm_requests = during["requests"] - before["requests"]
    seconds = ended - storm_started
    figures: dict[str, Any] = {
        "test": "429_storm_10min",
        "messages": n,
        "duration_s": round(drained - storm_started, 1),
        "fault_s": round(seconds, 1),
        "recovery_s": round(after["first_executed_at"] - ended_wall, 1) if after["first_executed_at"] else None,
        "recovery_means": "storm switched off -> the broker's first 201",
        "drain_after_storm_s": round(drained - ended, 1),
        "storm_requests": storm_requests,
        "storm_requests_per_s": round(storm_requests / seconds, 1),
        "storm_requests_per_s_per_relay": round(storm_requests / seconds / RELAYS, 1),
        "storm_claimed_rows": claims,
        "storm_claim_batches": claim_batches,
        "storm_claim_batches_per_s": round(claim_batches / seconds, 2),
        "storm_429_answers": during["answers"].get("429", 0) - before["answers"].get("429", 0),
        "retry_after_s": RETRY_AFTER_S,
        "batch_size": BATCH,
        "relays": RELAYS,
        "pause_seen_in_samples": f"{paused_seen}/{samples}",
        "max_attempts_during_storm": max_attempts_during,
        "dead_during_storm": dead_during,
    }
    exit_codes = finish(stack, figures, keys)
    figures["problems"] = problems = []
    if figures["lost"] or figures["lost_at_broker"]:
        problems.append(f"lost {figures['lost']} (not executed at the broker: {figures['lost_at_broker']})")
    if figures["dead"] or dead_during:
        problems.append(f"dead: {figures['dead']} (during the storm: {dead_during})")
    if figures["executed_twice"]:
        problems.append(f"executed twice: {figures['executed_twice']}")
    if figures["left_in_sending"]:
        problems.append(f"left in sending: {figures['left_in_sending']}")
    # Throttling spends no attempt: every row ends on the attempt that delivered it (a second one at most).
    if max(max_attempts_during, figures["max_attempts"]) > 2:
        problems.append(
            f"throttling spent attempts: max attempts {max_attempts_during} during the storm, "
            f"{figures['max_attempts']} at the end"
        )
    # The table-wide pause, and one message first when it runs out: about one request per relay per
    # Retry-After reaches the broker (without them, a batch per relay, or every row, each Retry-After).
    ceiling = RELAYS * 2 / RETRY_AFTER_S * 1.5
    if figures["storm_requests_per_s"] > ceiling:
        problems.append(
            f"{figures['storm_requests_per_s']} requests/s during the storm: more than "
            f"{ceiling:.0f}/s (1.5 x two requests per relay per Retry-After): "
            "the pause does not hold the table"
        )
    if figures["recovery_s"] is None or figures["recovery_s"] > RETRY_AFTER_S + RESUME_LIMIT_S:
        problems.append(f"delivery resumed {figures['recovery_s']} s after the storm")
    if set(exit_codes.values()) != {0}:
        problems.append(f"relays did not stop cleanly on SIGTERM: {exit_codes}")
    return figures


def run_side_by_side(scenarios: dict[str, Callable[[], dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, BaseException] = {}

    def run(name: str, scenario: Callable[[], dict[str, Any]]) -> None:
        try:
            results[name] = scenario()
        except BaseException as exc:  # reported after both have finished
            errors[name] = exc

    threads = [threading.Thread(target=run, args=item, name=f"soak-{item[0]}") for item in scenarios.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, exc in errors.items():
        print(f"soak scenario {name} raised: {exc!r}", flush=True)
    if errors:
        raise next(iter(errors.values()))
    return results


@pytest.mark.soak
@pytest.mark.timeout(2400)
def test_soak_10min_broker_outage_and_10min_429_storm_side_by_side(soak_stack):
    n = int(scaled(3_000, 500))
    fault_s = scaled(600, 30)
    outage, storm = soak_stack("outage"), soak_stack("storm")
    results = run_side_by_side(
        {
            "outage": lambda: broker_outage(outage, n, fault_s),
            "storm": lambda: storm_429(storm, n, fault_s),
        }
    )
    for figures in results.values():
        record(figures)
    problems = [f"{name}: {p}" for name, figures in results.items() for p in figures["problems"]]
    diagnostics = "\n".join(stack.diagnostics() for stack in (outage, storm)) if problems else ""
    assert not problems, "\n".join(problems) + "\n" + diagnostics
