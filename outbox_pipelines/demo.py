"""The demo: every shipped table end to end on the embedded default, in about ten seconds.

Orders go to a local broker simulator that injects faults (503, 429 with
Retry-After, 400); memory writes show dedup; events go to in-process handlers
(a flaky one retries, a malformed payload dies, an unknown topic waits).
Backoffs are shortened so the demo finishes quickly; nothing else differs
from production.
"""

import time
import uuid
from dataclasses import replace

from outbox_pipelines.broker_sim import BrokerSim, Faults
from outbox_pipelines.core import db, migrate
from outbox_pipelines.core.destinations import HttpDestination, PaperBroker
from outbox_pipelines.core.health import read_status
from outbox_pipelines.core.models import STATES, Message
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.store import Outbox
from outbox_pipelines.core.table import OutboxTable
from outbox_pipelines.core.wiring import build_destination

DEMO_RETRY = RetryPolicy(base_s=0.3, max_s=2.0, max_attempts=4, jitter=0.1)


def _enqueue_samples(url: str, run: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with db.connect(url, autocommit=False) as conn:
        orders = Outbox("outbox_orders")
        for n in range(12):
            orders.enqueue(conn, Message(
                topic="order.submitted",
                payload={"idempotency_key": f"{run}-order-{n}", "symbol": "USDJPY", "side": "BUY", "qty_lots": 1 + n % 3},
                event_id=f"{run}-order-{n}",
                headers={"trace_id": f"demo-{run}-{n}"},
            ))
        again = orders.enqueue(conn, Message(topic="order.submitted", payload={"idempotency_key": f"{run}-order-0"},
                                             event_id=f"{run}-order-0"))
        counts["duplicate_enqueues"] = int(again.duplicate)
        memory = Outbox("outbox_memory")
        for n in range(6):
            memory.enqueue(conn, Message(topic="space:team", payload={"note": f"fact {n % 4}", "run": run},
                                         event_id=f"{run}-memory-{n}"))
        events = Outbox("outbox_events")
        for n in range(8):
            events.enqueue(conn, Message(topic="org.changed", payload={"org_id": n}, event_id=f"{run}-org-{n}"))
        events.enqueue(conn, Message(topic="demo.flaky", payload={"x": 1}, event_id=f"{run}-flaky"))
        events.enqueue(conn, Message(topic="org.changed", payload={"name": "no org_id"}, event_id=f"{run}-malformed"))
        events.enqueue(conn, Message(topic="nobody.listens", payload={"x": 1}, event_id=f"{run}-unrouted"))
        conn.commit()
    return counts


def run_demo(url: str, quiet: bool = False) -> int:
    import sys

    sys.stderr.flush()
    applied = migrate.upgrade(url)
    if applied:
        print(f"migrated the database: {', '.join(applied)}")
    run = time.strftime("%H%M%S") + "-" + uuid.uuid4().hex[:4]
    faults = Faults(
        flaky_keys={f"{run}-order-1": 1, f"{run}-order-2": 2},
        rate_limited_keys={f"{run}-order-3": 1.0},
        bad_keys={f"{run}-order-4"},
    )
    broker = BrokerSim(faults).start_in_thread()
    print(f"broker simulator on {broker.url} (503 for 2 orders, 429 + Retry-After for 1, 400 for 1)")
    settings = load_settings()
    extra = _enqueue_samples(url, run)
    print(f"enqueued 12 orders (+1 duplicate enqueue, answered duplicate={bool(extra['duplicate_enqueues'])}), "
          "6 memory writes (2 repeated payloads), 11 events")
    try:
        deadline = time.monotonic() + 20
        for name in ("outbox_orders", "outbox_memory", "outbox_events"):
            table = replace(settings.table(name), retry=DEMO_RETRY, idle_sleep_s=0.05)
            if name == "outbox_orders":
                table = replace(table, destination="http", url=broker.url)
                destination = HttpDestination(broker.url, timeout_s=2.0, parallelism=8)
            else:
                destination = build_destination(table, settings) if table.destination != "paper" else PaperBroker()
            try:
                while time.monotonic() < deadline:
                    report = Relay(url, table, destination).run(once=True)
                    if not quiet and report.claimed:
                        print(f"  {name}: sent {report.sent} (dedup {report.dedup_hits}), retried {report.retried}, dead {report.dead}")
                    with db.connect(url) as conn:
                        due = OutboxTable(conn, name).next_due_in_s()
                    if due is None or due > 3.0:
                        break
                    time.sleep(max(due, 0.05))
            finally:
                destination.close()
    finally:
        broker.stop()
    print()
    print(f"{'table':<16}" + "".join(f"{s:>10}" for s in STATES) + "   dead by code")
    with db.connect(url) as conn:
        for name in ("outbox_orders", "outbox_memory", "outbox_events"):
            status = read_status(OutboxTable(conn, name))
            dead = ", ".join(f"{k}={v}" for k, v in status.dead_by_code.items()) or "-"
            print(f"{name:<16}" + "".join(f"{status.counts.get(s, 0):>10}" for s in STATES) + f"   {dead}")
        audits = conn.execute(
            "SELECT code, count(*) AS n FROM outbox_audit WHERE event_id LIKE %s GROUP BY code ORDER BY code",
            (f"{run}-%",),
        ).fetchall()
    print("\naudit trail of this run: " + ", ".join(f"{r['code']}={r['n']}" for r in audits))
    print(f"broker executed {len(broker.executed)} distinct orders over {broker.requests} requests (each key at most once)")
    print("\nnext: 'outbox-pipelines status' for the numbers, 'outbox-pipelines replay --table outbox_orders --dry-run --all'"
          " for the dead letters, 'outbox-pipelines dev' for the Dagster UI")
    return 0
