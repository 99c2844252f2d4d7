"""Chaos soak: 8 relay processes, one SIGKILLed (and restarted) every 7 s, a broker failing 25 % of requests.

The broker simulator answers about a quarter of the requests with a fault, by request number:
503 every 8th, 429 (Retry-After 1 s) every 13th, a dropped connection every 23rd, a 3 s hang
(past the 2.5 s IOC timeout; the order is executed late) every 29th. Kills continue until every
order is sent. The promise: nothing lost (every event id executed at the broker and ``sent``),
nothing executed twice, nothing dead, nothing left in ``sending``; repeats at the broker
(duplicate deliveries, answered 409 "already processed") are counted and reported.
"""

import time
from collections import Counter

import pytest

from outbox_pipelines_tests.soak.conftest import (
    ORDERS_MAX_ATTEMPTS,
    TABLE,
    record,
    scaled,
)

RELAYS = 8
KILL_EVERY_S = 7.0
LEASE_S = 15  # OUTBOX_RELAY_LOCK_TTL: a killed relay's rows are re-taken by a claim after this
FAULTS = [
    "--every-nth-5xx",
    "8",
    "--every-nth-429",
    "13",
    "--retry-after",
    "1",
    "--every-nth-drop",
    "23",
    "--every-nth-timeout",
    "29",
    "--hang",
    "3",
]


def fault_share() -> float:
    """The share of requests that get a fault (the union of the four periods)."""
    periods = (8, 13, 23, 29)
    return 1.0 - sum(all(i % p for p in periods) for i in range(1, 8 * 13 * 23 * 29 + 1)) / (8 * 13 * 23 * 29)


@pytest.mark.soak
@pytest.mark.timeout(1500)
def test_soak_chaos_8_relays_sigkill_every_7s_broker_25pct_faults(soak_stack):
    n = int(scaled(30_000, 1_000))
    drain_limit_s = scaled(900, 300)
    stack = soak_stack("chaos")
    broker = stack.start_broker(FAULTS)
    stack.configure_relays(OUTBOX_RELAY_LOCK_TTL=f"{LEASE_S}s")
    keys = stack.db.enqueue_orders("chaos", n)

    started = time.monotonic()
    for slot in range(RELAYS):
        stack.start_relay(slot)
    kills, next_kill, last_kill = 0, started + KILL_EVERY_S, started
    exited_by_themselves: list[str] = []
    progress: list[tuple[float, dict[str, int]]] = []
    with stack.db.connect() as conn:
        while True:
            found = {
                r["status"]: r["n"]
                for r in conn.execute(f"SELECT status, count(*) AS n FROM {TABLE} GROUP BY status").fetchall()
            }
            if set(found) <= {"sent", "dead"}:
                break
            now = time.monotonic()
            if now - started > drain_limit_s:
                pytest.fail(f"not drained after {drain_limit_s:.0f} s: {found}\n{stack.diagnostics()}", pytrace=False)
            if not progress or now - progress[-1][0] >= 15:
                progress.append((now, found))
                print(f"chaos +{now - started:5.0f}s: {found}, kills {kills}", flush=True)
            for slot, relay in stack.relays.items():
                if not relay.running:  # a relay must never stop by itself
                    exited_by_themselves.append(f"{relay.name} exited {relay.proc.returncode if relay.proc else '?'}")
                    stack.start_relay(slot)
            if now >= next_kill:
                slot = kills % RELAYS
                stack.relays[slot].kill()
                stack.start_relay(slot)
                kills += 1
                last_kill = now
                next_kill += KILL_EVERY_S
            time.sleep(0.5)
    drained = time.monotonic()
    exit_codes = {relay.name: relay.stop(grace_s=30) for relay in stack.relays.values()}

    found = stack.db.statuses()
    stats = broker.stats()
    executed = broker.executed_keys()
    attempts = Counter(
        {
            r["attempts"]: r["n"]
            for r in stack.db.query(f"SELECT attempts, count(*) AS n FROM {TABLE} GROUP BY attempts")
        }
    )
    audit = {
        r["code"]: r["n"]
        for r in stack.db.query(
            "SELECT code, count(*) AS n FROM outbox_audit WHERE outbox_table = %s GROUP BY code", (TABLE,)
        )
    }
    retaken = stack.db.scalar(
        "SELECT count(*) FROM outbox_audit WHERE outbox_table = %s AND code = 'outbox_claim' "
        "AND from_status = 'sending'",
        (TABLE,),
    )
    lost_at_broker = sorted(set(keys) - executed)
    figures = {
        "test": "chaos_8_relays_sigkill_every_7s",
        "messages": n,
        "duration_s": round(drained - started, 1),
        "lost": n - found.get("sent", 0),
        "lost_at_broker": len(lost_at_broker),
        "dead": found.get("dead", 0),
        "executed_twice": stats["answers"].get("201", 0) - stats["executed"],
        "duplicate_deliveries": stats["repeats"],
        "keys_delivered_twice_or_more": stats["keys_repeated"],
        "left_in_sending": found.get("sending", 0),
        "recovery_s": round(drained - last_kill, 1),
        "recovery_means": "last SIGKILL -> every order sent",
        "relays": RELAYS,
        "kills": kills,
        "lease_s": LEASE_S,
        "broker_requests": stats["requests"],
        "broker_answers": stats["answers"],
        "fault_share": round(fault_share(), 3),
        "leases_retaken_by_claim": retaken,
        "leases_requeued": audit.get("outbox_requeue", 0),
        "settle_conflicts": audit.get("outbox_flush_conflict", 0),
        "attempts_histogram": dict(sorted(attempts.items())),
        "max_attempts": max(attempts) if attempts else 0,
        "relays_that_exited_by_themselves": exited_by_themselves,
        "exit_codes_on_sigterm": sorted(set(exit_codes.values()), key=str),
        "throughput_per_s": round(n / max(drained - started, 1e-9), 1),
    }
    record(figures)

    assert figures["lost"] == 0 and not lost_at_broker, f"lost: {figures['lost']}, not executed: {lost_at_broker[:20]}"
    assert figures["dead"] == 0, stack.db.query(
        f"SELECT id, event_id, attempts, last_error_code, last_error FROM {TABLE} WHERE status = 'dead' LIMIT 20"
    )
    assert figures["executed_twice"] == 0
    assert figures["left_in_sending"] == 0
    assert figures["max_attempts"] <= ORDERS_MAX_ATTEMPTS
    assert stats["requests"] <= 2 * n, f"{stats['requests']} requests for {n} orders"
    assert not exited_by_themselves, exited_by_themselves
    assert set(exit_codes.values()) == {0}, (
        f"relays did not stop cleanly on SIGTERM: {exit_codes}\n{stack.relay_logs()}"
    )
