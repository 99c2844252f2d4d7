"""The demo: every shipped table end to end through the Dagster jobs, on the embedded default.

Orders go to a local broker simulator that injects faults (503, 429 with
Retry-After, 400); memory writes show dedup; events go to in-process handlers
(a flaky one retries, a malformed payload dies, an unknown topic waits).
Backoffs are shortened so the demo finishes quickly; nothing else differs
from production.
"""

import time
import uuid

from outbox_pipelines.broker_sim import BrokerSim, Faults
from outbox_pipelines.core import db, migrate
from outbox_pipelines.core.health import read_status
from outbox_pipelines.core.models import STATES, Message
from outbox_pipelines.core.store import Outbox
from outbox_pipelines.core.table import OutboxTable


def _order(key: str, n: int) -> dict:
    """An OrderRequest v1.1 as an application would enqueue it."""
    return {"order_id": f"ord-{key}", "instrument": ("USDJPY", "EURUSD", "GBPJPY")[n % 3], "side": ("BUY", "SELL")[n % 2],
            "qty": round(0.1 * (1 + n % 3), 2), "price": None if n % 2 else 145.0 + n / 100, "time_in_force": "IOC",
            "tags": ["demo"], "idempotency_key": key, "requested_at": "2025-08-24T00:00:00Z"}


def _enqueue_samples(url: str, run: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with db.connect(url, autocommit=False) as conn:
        orders = Outbox("outbox_orders")
        for n in range(12):
            orders.enqueue(conn, Message(
                topic="order.submitted", payload=_order(f"{run}-order-{n}", n), event_id=f"{run}-order-{n}",
                headers={"trace_id": f"demo-{run}-{n}"},
            ))
        again = orders.enqueue(conn, Message(topic="order.submitted", payload=_order(f"{run}-order-0", 0),
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
        member_events = Outbox("outbox_members")
        for n in range(3):
            member_events.enqueue(conn, Message(topic="MemberCreatedEvent", event_id=f"{run}-member-{n}", payload={
                "member_id": f"{run}-{n}", "email": f"member{n}@example.test" if n < 2 else "not-an-email",
                "name": f"Member {n}"}))
        conn.commit()
    return counts


DEMO_CONFIG = """
# Written by `outbox-pipelines demo`: production settings with short backoffs.
[tables.outbox_orders]
base = "300ms"
max_backoff = "2s"
max_attempts = 4
[tables.outbox_memory]
base = "300ms"
max_backoff = "2s"
max_attempts = 4
[tables.outbox_events]
base = "300ms"
max_backoff = "2s"
max_attempts = 4
[tables.outbox_members]
base = "300ms"
max_backoff = "2s"
"""

TABLES = ("outbox_orders", "outbox_memory", "outbox_events", "outbox_members")
# The runs' full event logs are in the UI; the terminal gets the summary.
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def _order_api_calls(url: str, run: str) -> tuple[list[tuple[str, int]], str]:
    """Seed 001 over real HTTP: a new order, its replay, a conflicting body, an invalid order."""
    import socket
    import threading

    import httpx
    import uvicorn

    from outbox_pipelines.api.app import ApiSettings, create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(ApiSettings(database_url=url)), host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, name="order-api", daemon=True)
    thread.start()
    key = f"{run}-api-1"
    order = {"order_id": f"ord-{run}", "instrument": "USDJPY", "side": "BUY", "qty": 0.1, "price": None,
             "time_in_force": "IOC", "idempotency_key": key, "requested_at": "2025-08-24T00:00:00Z"}
    answers = []
    try:
        while not server.started:
            time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            headers = {"Idempotency-Key": key}
            answers.append(("new order", client.post("/do/order", json=order, headers=headers).status_code))
            answers.append(("same again", client.post("/do/order", json=order, headers=headers).status_code))
            answers.append(("same key, other qty", client.post("/do/order", json={**order, "qty": 0.2}, headers=headers).status_code))
            bad = {**order, "idempotency_key": f"{run}-api-2", "qty": 0.015, "instrument": "XAUUSD"}
            answers.append(("invalid order", client.post("/do/order", json=bad, headers={"Idempotency-Key": bad["idempotency_key"]}).status_code))
    finally:
        server.should_exit = True
        thread.join(10)
    return answers, key


def run_demo(url: str, quiet: bool = False) -> int:
    import os
    import sys

    import dagster as dg

    from outbox_pipelines.dagster_home import prepare_dagster_home
    from outbox_pipelines.definitions import build_definitions
    from outbox_pipelines.defs.resources import OutboxDatabase, OutboxDestinations

    sys.stderr.flush()
    applied = migrate.upgrade(url)
    if applied:
        print(f"migrated the database: {', '.join(applied)}")
    os.environ.update(prepare_dagster_home(url))
    os.environ.setdefault(db.DATABASE_URL_ENV, url)  # the member handler records emails in this database
    config_path = db.embedded_dir() / "demo-outbox.toml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(DEMO_CONFIG)

    run = time.strftime("%H%M%S") + "-" + uuid.uuid4().hex[:4]
    faults = Faults(
        flaky_keys={f"{run}-order-1": 1, f"{run}-order-2": 2},
        rate_limited_keys={f"{run}-order-3": 1.0},
        bad_keys={f"{run}-order-4"},
    )
    broker = BrokerSim(faults).start_in_thread()
    print(f"broker simulator on {broker.url} (503 for 2 orders, 429 + Retry-After for 1, 400 for 1)")
    extra = _enqueue_samples(url, run)
    api_answers, api_key = _order_api_calls(url, run)
    print("Order API (seed 001): " + ", ".join(f"{what} → {code}" for what, code in api_answers))
    print(f"enqueued 12 orders (+1 duplicate enqueue, answered duplicate={bool(extra['duplicate_enqueues'])}), "
          "6 memory writes (2 repeated payloads), 11 events, 3 member sign-ups")
    definitions = build_definitions({
        "outbox_db": OutboxDatabase(url=url, config_path=str(config_path)),
        "outbox_destinations": OutboxDestinations(url_overrides={"outbox_orders": broker.url}),
    })
    runs = 0
    try:
        with dg.DagsterInstance.get() as instance:
            deadline = time.monotonic() + 30
            pending = set(TABLES)
            while pending and time.monotonic() < deadline:
                for name in sorted(pending):
                    job = definitions.resolve_job_def(f"relay_{name}_job")
                    result = job.execute_in_process(
                        run_config={"ops": {"relay_table": {"config": {"table": name, "once": True}}}, **QUIET},
                        instance=instance, tags={"outbox/table": name, "outbox/trigger": "demo"},
                    )
                    runs += 1
                    meta = {k: getattr(v, "value", v) for e in result.all_events
                            if e.event_type_value == "STEP_OUTPUT" for k, v in e.event_specific_data.metadata.items()}
                    if not quiet and meta.get("claimed"):
                        print(f"  run {result.run_id[:8]} {name}: sent {meta['sent']} (dedup {meta['dedup_hits']}), "
                              f"retried {meta['retried']}, dead {meta['dead']}")
                    with db.connect(url) as conn:
                        due = OutboxTable(conn, name).next_due_in_s()
                    if due is None or due > 3.0:
                        pending.discard(name)
                if pending:
                    time.sleep(0.4)
            checks = definitions.resolve_job_def("outbox_checks_job").execute_in_process(instance=instance, run_config=QUIET)
            runs += 1
            verdicts = [e.event_specific_data for e in checks.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    finally:
        broker.stop()
    print()
    print(f"{'table':<16}" + "".join(f"{s:>10}" for s in STATES) + "   dead by code")
    with db.connect(url) as conn:
        for name in TABLES:
            status = read_status(OutboxTable(conn, name), count_sent=True)
            dead = ", ".join(f"{k}={v}" for k, v in status.dead_by_code.items()) or "-"
            print(f"{name:<16}" + "".join(f"{status.counts.get(s, 0):>10}" for s in STATES) + f"   {dead}")
        audits = conn.execute(
            "SELECT code, count(*) AS n FROM outbox_audit WHERE event_id LIKE %s GROUP BY code ORDER BY code",
            (f"{run}-%",),
        ).fetchall()
    print("\naudit trail of this run: " + ", ".join(f"{r['code']}={r['n']}" for r in audits))
    print(f"broker executed {len(broker.executed)} distinct orders over {broker.requests} requests (each key at most once)")
    with db.connect(url) as conn:
        entry = conn.execute("SELECT status, result FROM idempo_ledger WHERE idempotency_key = %s", (api_key,)).fetchone()
        emails = conn.execute("SELECT count(*) AS n FROM automated_email_recipients WHERE event_id LIKE %s",
                              (f"{run}-%",)).fetchone()["n"]
    result = entry["result"] or {}
    print(f"ledger of order {api_key}: {entry['status']}, broker order {result.get('broker_order_id')}")
    print(f"welcome emails (seed 002): {emails} sent, recorded in automated_email_recipients, files in "
          f"{os.environ.get('OUTBOX_MAIL_DIR') or db.embedded_dir() / 'mail'}")
    failing = [f"{v.asset_key.path[-1]}:{v.check_name}={v.severity.value}" for v in verdicts if not v.passed]
    print(f"asset checks: {len(verdicts) - len(failing)} passed" + (f", not passing: {', '.join(failing)}" if failing else ""))
    print(f"\n{runs} Dagster runs recorded. Next: 'outbox-pipelines dev' and open the UI: Runs (relay metadata), "
          "Assets → outbox (checks); 'outbox-pipelines status'; "
          "'outbox-pipelines replay --table outbox_orders --all --dry-run' for the dead letters")
    return 0
