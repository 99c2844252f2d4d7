"""The demo: every shipped table end to end through the Dagster jobs, on the embedded default.

Orders go to a fault-injecting broker simulator, memory writes show dedup, events go to in-process handlers;
only the backoffs are shortened. Where its data goes: demo/data.py (``prepare_demo``).
"""

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from psycopg.rows import dict_row

from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import STATES, Message
from outbox_pipelines.core.oncall.health import read_status
from outbox_pipelines.core.settings import DEFAULT_GROUP, load_settings
from outbox_pipelines.core.storage import db, migrate
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.defs.dagster_home import prepare_dagster_home
from outbox_pipelines.orders.broker_sim import BrokerSim, Faults

if TYPE_CHECKING:
    import dagster as dg


def _order(key: str, n: int) -> dict[str, Any]:
    """An OrderRequest v1.1 as an application would enqueue it."""
    return {
        "order_id": f"ord-{key}",
        "instrument": ("USDJPY", "EURUSD", "GBPJPY")[n % 3],
        "side": ("BUY", "SELL")[n % 2],
        "qty": round(0.1 * (1 + n % 3), 2),
        "price": None if n % 2 else 145.0 + n / 100,
        "time_in_force": "IOC",
        "tags": ["demo"],
        "idempotency_key": key,
        "requested_at": "2025-08-24T00:00:00Z",
    }


def _enqueue_samples(url: str, run: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with db.connect(url, autocommit=False) as conn:
        orders = Outbox("outbox_orders")
        for n in range(12):
            orders.enqueue(
                conn,
                Message(
                    topic="order.submitted",
                    payload=_order(f"{run}-order-{n}", n),
                    event_id=f"{run}-order-{n}",
                    headers={"trace_id": f"demo-{run}-{n}"},
                ),
            )
        again = orders.enqueue(
            conn, Message(topic="order.submitted", payload=_order(f"{run}-order-0", 0), event_id=f"{run}-order-0")
        )
        counts["duplicate_enqueues"] = int(again.duplicate)
        memory = Outbox("outbox_memory")
        for n in range(6):
            memory.enqueue(
                conn,
                Message(
                    topic="space:team", payload={"note": f"fact {n % 4}", "run": run}, event_id=f"{run}-memory-{n}"
                ),
            )
        events = Outbox("outbox_events")
        for n in range(8):
            events.enqueue(conn, Message(topic="org.changed", payload={"org_id": n}, event_id=f"{run}-org-{n}"))
        events.enqueue(conn, Message(topic="demo.flaky", payload={"x": 1}, event_id=f"{run}-flaky"))
        events.enqueue(conn, Message(topic="org.changed", payload={"name": "no org_id"}, event_id=f"{run}-malformed"))
        events.enqueue(conn, Message(topic="nobody.listens", payload={"x": 1}, event_id=f"{run}-unrouted"))
        member_events = Outbox("outbox_members")
        for n in range(3):
            member_events.enqueue(
                conn,
                Message(
                    topic="MemberCreatedEvent",
                    event_id=f"{run}-member-{n}",
                    payload={
                        "member_id": f"{run}-{n}",
                        "email": f"member{n}@example.test" if n < 2 else "not-an-email",
                        "name": f"Member {n}",
                    },
                ),
            )
        conn.commit()
    return counts


# The opt-in parts the demo shows (core/wings.py): the order product and the seeds' examples, with their tables.
DEMO_PARTS = ("orders", "examples")
DEMO_CONFIG = """
# Written by `outbox-pipelines demo`: production settings with short backoffs.
parts = ["orders", "examples"]

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _order_api_calls(url: str, run: str) -> tuple[list[tuple[str, int]], str]:
    """Seed 001 over real HTTP: a new order, its replay, a conflicting body, an invalid order."""
    # Imported here: the API's server stack (Starlette, uvicorn, tracing) adds ~0.5 s to every CLI command.
    import uvicorn

    from outbox_pipelines.orders.api.app import ApiSettings, create_app

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(ApiSettings(database_url=url)), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, name="order-api", daemon=True)
    thread.start()
    key = f"{run}-api-1"
    order = {
        "order_id": f"ord-{run}",
        "instrument": "USDJPY",
        "side": "BUY",
        "qty": 0.1,
        "price": None,
        "time_in_force": "IOC",
        "idempotency_key": key,
        "requested_at": "2025-08-24T00:00:00Z",
    }
    bad = {**order, "idempotency_key": f"{run}-api-2", "qty": 0.015, "instrument": "XAUUSD"}
    calls = [
        ("new order", order, key),
        ("same again", order, key),
        ("same key, other qty", {**order, "qty": 0.2}, key),
        ("invalid order", bad, f"{run}-api-2"),
    ]
    answers = []
    try:
        while not server.started:
            time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for what, body, idempotency_key in calls:
                answer = client.post("/do/order", json=body, headers={"Idempotency-Key": idempotency_key})
                answers.append((what, answer.status_code))
    finally:
        server.should_exit = True
        thread.join(10)
    return answers, key


def _write_demo_config(broker_url: str) -> Path:
    """The demo's settings: short backoffs, and its orders sent to the demo's broker simulator."""
    config_path = db.private_embedded_dir() / "demo-outbox.toml"
    orders = "[tables.outbox_orders]\n"
    text = DEMO_CONFIG.replace(orders, f"{orders}url = {json.dumps(broker_url)}\n", 1)
    db.write_private_file(config_path, text.encode())  # .outbox/ is private, and so is what is written there
    return config_path


def _demo_faults(run: str) -> Faults:
    return Faults(
        flaky_keys={f"{run}-order-1": 1, f"{run}-order-2": 2},
        rate_limited_keys={f"{run}-order-3": 1.0},
        bad_keys={f"{run}-order-4"},
    )


def _relay_group_once(definitions: "dg.Definitions", instance: "dg.DagsterInstance", quiet: bool) -> None:
    """One run of the relay group's job (once: each table drains what is ready), each table's counts printed."""
    from outbox_pipelines.defs.relay_group import relay_group_job_name

    job = definitions.resolve_job_def(relay_group_job_name(DEFAULT_GROUP))
    result = job.execute_in_process(
        run_config={"ops": {"relay_group": {"config": {"group": DEFAULT_GROUP, "once": True}}}, **QUIET},
        instance=instance,
        tags={"outbox/trigger": "demo"},
    )
    meta = {
        k: getattr(v, "value", v)
        for e in result.all_events
        if e.event_type_value == "STEP_OUTPUT"
        for k, v in e.step_output_data.metadata.items()
    }
    tables = meta.get("tables")
    for table_name, counts in sorted(tables.items() if isinstance(tables, dict) else []):
        if not quiet:
            print(
                f"  run {result.run_id[:8]} {table_name}: sent {counts['sent']} (dedup {counts['dedup_hits']}), "
                f"retried {counts['retried']}, dead {counts['dead']}"
            )


def _relay_until_settled(definitions: "dg.Definitions", instance: "dg.DagsterInstance", url: str, quiet: bool) -> int:
    """Relay group runs until no table has a message due within 3 s (30 s at most); the runs made."""
    runs = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _relay_group_once(definitions, instance, quiet)
        runs += 1
        with db.connect(url) as conn:
            due = [OutboxTable(conn, table_name).next_due_in_s() for table_name in TABLES]
        if all(d is None or d > 3.0 for d in due):
            break
        time.sleep(0.4)
    return runs


def _run_dagster_jobs(url: str, config_path: Path, quiet: bool) -> tuple[int, list["dg.AssetCheckEvaluation"]]:
    """The relay jobs until the tables settle, then the checks job: the runs made and the check verdicts."""
    # Imported here: Dagster adds about a second to every CLI command, and only this one needs it.
    import dagster as dg

    from outbox_pipelines.defs.factory import build_from_settings
    from outbox_pipelines.defs.resources import outbox_resources

    # The demo's own declaration (its tables, its broker), whatever tables the project around it declares.
    definitions = build_from_settings(
        load_settings(path=config_path), outbox_resources(url=url, config_path=str(config_path))
    )
    with dg.DagsterInstance.get() as instance:
        runs = _relay_until_settled(definitions, instance, url, quiet)
        checks = definitions.resolve_job_def("outbox_checks_job").execute_in_process(
            instance=instance, run_config=QUIET
        )
        verdicts = [
            e.asset_check_evaluation_data for e in checks.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"
        ]
    return runs + 1, verdicts


def _print_tables(url: str, run: str) -> None:
    print()
    print(f"{'table':<16}" + "".join(f"{s:>10}" for s in STATES) + "   dead by code")
    with db.connect(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        for table_name in TABLES:
            status = read_status(OutboxTable(conn, table_name), count_sent=True)
            dead = ", ".join(f"{k}={v}" for k, v in status.dead_by_code.items()) or "-"
            print(f"{table_name:<16}" + "".join(f"{status.counts.get(s, 0):>10}" for s in STATES) + f"   {dead}")
        audits = cur.execute(
            "SELECT code, count(*) AS n FROM outbox_audit WHERE event_id LIKE %s GROUP BY code ORDER BY code",
            (f"{run}-%",),
        ).fetchall()
    print("\naudit trail of this run: " + ", ".join(f"{r['code']}={r['n']}" for r in audits))


def _print_outcomes(url: str, run: str, api_key: str, broker: BrokerSim) -> None:
    """What the broker executed, the ledger of the API's order, and the welcome emails."""
    print(
        f"broker executed {len(broker.executed)} distinct orders over {broker.requests} requests "
        "(each key at most once)"
    )
    with db.connect(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        entry = cur.execute(
            "SELECT status, result FROM idempo_ledger WHERE idempotency_key = %s", (api_key,)
        ).fetchone()
        emails = cur.execute(
            "SELECT count(*) AS n FROM automated_email_recipients WHERE event_id LIKE %s", (f"{run}-%",)
        ).fetchone()
    assert entry is not None and emails is not None, "the API wrote its order's ledger row; a count is one row"
    broker_result = entry["result"] or {}
    print(f"ledger of order {api_key}: {entry['status']}, broker order {broker_result.get('broker_order_id')}")
    print(
        f"welcome emails (seed 002): {emails['n']} sent, recorded in automated_email_recipients, files in "
        f"{os.environ.get('OUTBOX_MAIL_DIR') or db.embedded_dir() / 'mail'}"
    )


def _print_checks(verdicts: list["dg.AssetCheckEvaluation"]) -> None:
    failing = [f"{v.asset_key.path[-1]}:{v.check_name}={v.severity.value}" for v in verdicts if not v.passed]
    print(
        f"asset checks: {len(verdicts) - len(failing)} passed"
        + (f", not passing: {', '.join(failing)}" if failing else "")
    )


def run_demo(url: str, quiet: bool = False, data_env: str = "") -> int:
    """The demo on ``url``; ``data_env`` (DemoData's) is what the commands it suggests at the end need set."""
    sys.stderr.flush()
    applied = migrate.upgrade(url, parts=DEMO_PARTS)
    if applied:
        print(f"migrated the database: {', '.join(applied)}")
    os.environ.update(prepare_dagster_home(url))
    os.environ.setdefault(db.DATABASE_URL_ENV, url)  # the member handler records emails in this database
    run = time.strftime("%H%M%S") + "-" + uuid.uuid4().hex[:4]
    broker = BrokerSim(_demo_faults(run)).start_in_thread()
    config_path = _write_demo_config(broker.url)
    print(f"broker simulator on {broker.url} (503 for 2 orders, 429 + Retry-After for 1, 400 for 1)")
    extra = _enqueue_samples(url, run)
    api_answers, api_key = _order_api_calls(url, run)
    print("Order API (seed 001): " + ", ".join(f"{what} → {code}" for what, code in api_answers))
    print(
        f"enqueued 12 orders (+1 duplicate enqueue, answered duplicate={bool(extra['duplicate_enqueues'])}), "
        "6 memory writes (2 repeated payloads), 11 events, 3 member sign-ups"
    )
    try:
        runs, verdicts = _run_dagster_jobs(url, config_path, quiet)
    finally:
        broker.stop()
    _print_tables(url, run)
    _print_outcomes(url, run, api_key, broker)
    _print_checks(verdicts)
    print(
        f"\n{runs} Dagster runs recorded. Next: 'outbox-pipelines dev' and open the UI: Runs (relay metadata), "
        "Assets → outbox (checks); 'outbox-pipelines status'; "
        "'outbox-pipelines replay --table outbox_orders --all --dry-run' for the dead letters"
    )
    if data_env:
        print(
            f"No project here: 'export {data_env}' first, and those commands find the demo's data "
            "('outbox-pipelines db stop' then stops its PostgreSQL)"
        )
    return 0
