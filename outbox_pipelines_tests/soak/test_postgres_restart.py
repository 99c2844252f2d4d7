"""A hard PostgreSQL restart mid-drain: ``pg_ctl stop -m immediate`` on the soak's own server, 10 s down.

Two relay processes drain 20,000 orders to the broker simulator (no faults). A quarter of
the way through, the server is stopped the hard way (every backend killed, crash recovery on
the next start) and started again 10 s later. The promise: the relays reconnect by themselves
(no restart, no operator), give back the rows they held as soon as they reconnect, and the
claim re-takes any lease that expired; nothing is lost; no row stays in ``sending`` past
the lease + 30 s after the restart. Duplicate deliveries (broker repeats: batches delivered
whose settle the crash lost) are counted and must stay within what the relays had in flight.
"""

import time

import psycopg
import pytest

from outbox_pipelines_tests.helpers import wait_until
from outbox_pipelines_tests.soak.conftest import TABLE, record, scaled

RELAYS = 2
BATCH = 100
LEASE_S = 20  # OUTBOX_RELAY_LOCK_TTL
DOWN_S = 10.0
# A relay claims the next batch while one is on the wire but settles a batch before sending the
# next, so a crash can catch at most one delivered-but-unsettled batch per relay. A quarter of the
# way through every batch is full, and a full batch's settle waits for its WAL flush (only a batch
# that empties the queue settles without: docs/explanation/relay.md, "Commits and the WAL flush"), so none
# settled is lost.
IN_FLIGHT_BATCHES = 1


def count_sent(db) -> int | None:
    try:
        return db.scalar(f"SELECT count(*) FROM {TABLE} WHERE status = 'sent'")
    except psycopg.Error:
        return None


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_soak_hard_postgres_restart_mid_drain(soak_stack):
    n = int(scaled(20_000, 2_000))
    stack = soak_stack("pg-restart")
    broker = stack.start_broker()
    stack.configure_relays(OUTBOX_RELAY_LOCK_TTL=f"{LEASE_S}s", OUTBOX_BATCH_SIZE=str(BATCH))
    keys = stack.db.enqueue_orders("pgr", n)
    started = time.monotonic()
    for slot in range(RELAYS):
        stack.start_relay(slot)

    with stack.db.connect() as conn:
        while True:
            sent = conn.execute(f"SELECT count(*) AS n FROM {TABLE} WHERE status = 'sent'").fetchone()["n"]
            if sent >= n // 4:
                break
            if time.monotonic() - started > 300:
                pytest.fail(f"the relays did not get a quarter through in 300 s\n{stack.diagnostics()}", pytrace=False)
            time.sleep(0.05)
    requests_before = broker.stats()["requests"]
    stack.db.stop_immediately()
    stopped = time.monotonic()
    time.sleep(DOWN_S)
    alive_while_down = {relay.name: relay.running for relay in stack.relays.values()}
    stack.db.start()
    restarted = time.monotonic()

    # The rows held when the database went away, as the restarted database has them.
    held = {r["id"] for r in stack.db.query(f"SELECT id FROM {TABLE} WHERE status = 'sending'")}
    sent_at_restart = stack.db.scalar(f"SELECT count(*) FROM {TABLE} WHERE status = 'sent'")
    first_settle = wait_until(
        lambda: (count_sent(stack.db) or 0) > sent_at_restart and time.monotonic(),
        120,
        "the first delivery settled after the restart",
        interval_s=0.1,
        on_timeout=stack.diagnostics,
    )
    held_back_at: float | None = None
    while time.monotonic() < restarted + LEASE_S + 30:
        still_held = stack.db.scalar(
            f"SELECT count(*) FROM {TABLE} WHERE status = 'sending' AND id = ANY(%s)", (sorted(held),)
        )
        if still_held == 0 and held_back_at is None:
            held_back_at = time.monotonic()
        found = stack.db.statuses()
        if held_back_at is not None and set(found) == {"sent"}:
            break
        time.sleep(0.2)
    wait_until(
        lambda: set(stack.db.statuses()) <= {"sent", "dead"}, 300, "every order settled", on_timeout=stack.diagnostics
    )
    drained = time.monotonic()
    # Past the lease + 30 s after the restart: nothing may still be in sending.
    time.sleep(max(restarted + LEASE_S + 30 - time.monotonic(), 0))
    found = stack.db.statuses()
    alive_after = {relay.name: relay.running for relay in stack.relays.values()}
    exit_codes = {relay.name: relay.stop(grace_s=30) for relay in stack.relays.values()}
    stats = broker.stats()
    executed = broker.executed_keys()
    reconnects = stack.log_lines("database error, reconnecting")
    gave_back = stack.log_lines("rows held when the database failed")
    audit = {
        r["code"]: r["n"]
        for r in stack.db.query(
            "SELECT code, count(*) AS n FROM outbox_audit WHERE outbox_table = %s GROUP BY code", (TABLE,)
        )
    }
    bound = BATCH * RELAYS * IN_FLIGHT_BATCHES
    figures = {
        "test": "postgres_hard_restart_mid_drain",
        "messages": n,
        "duration_s": round(drained - started, 1),
        "lost": n - found.get("sent", 0),
        "lost_at_broker": len(set(keys) - executed),
        "dead": found.get("dead", 0),
        "executed_twice": stats["answers"].get("201", 0) - stats["executed"],
        "duplicate_deliveries": stats["repeats"],
        "duplicate_bound": bound,
        "left_in_sending": found.get("sending", 0),
        "recovery_s": round(first_settle - restarted, 1),
        "recovery_means": "PostgreSQL back -> first delivery settled",
        "down_s": round(restarted - stopped, 1),
        "held_at_restart": len(held),
        "held_rows_back_after_s": round(held_back_at - restarted, 1) if held_back_at else None,
        "lease_s": LEASE_S,
        "sent_before_stop": sent_at_restart,
        "requests_before_stop": requests_before,
        "relays_alive_while_down": all(alive_while_down.values()),
        "relays_alive_after": all(alive_after.values()),
        "reconnect_log_lines": reconnects,
        "gave_back_log_lines": gave_back,
        "audit_db_errors": audit.get("outbox_flush_db_error", 0) + audit.get("outbox_flush_db_timeout", 0),
        "settle_conflicts": audit.get("outbox_flush_conflict", 0),
        "broker_answers": stats["answers"],
    }
    record(figures)

    assert all(alive_while_down.values()) and all(alive_after.values()), (
        f"a relay exited instead of reconnecting: {alive_while_down} {alive_after}\n{stack.relay_logs()}"
    )
    assert figures["lost"] == 0 and figures["lost_at_broker"] == 0
    assert figures["dead"] == 0
    assert figures["executed_twice"] == 0
    assert figures["left_in_sending"] == 0
    assert held_back_at is not None, f"rows held at the crash still in sending {LEASE_S + 30} s after the restart"
    assert figures["duplicate_deliveries"] <= bound, figures
    assert stats["requests"] == n + stats["repeats"], f"{stats['requests']} requests for {n} orders (no faults)"
    assert reconnects >= RELAYS, stack.relay_logs()
    assert set(exit_codes.values()) == {0}, (
        f"relays did not stop cleanly on SIGTERM: {exit_codes}\n{stack.relay_logs()}"
    )
