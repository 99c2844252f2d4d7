"""Drills of the per-table settings ``claim = "transaction"`` and ``audit = "failures"``, run the way
users run them (docs/explanation/relay.md, "Claim modes"; docs/explanation/audit.md, "The audit setting"):

1. the real Dagster relay path: ``outbox-pipelines dev`` (the drill stack of conftest.py) with an
   outbox.toml that sets both on ``outbox_orders``; the relay run the sensor launches delivers to
   ``outbox-pipelines broker-sim``, with a flaky key, a throttled key and a poison key;
2. behind PgBouncer in transaction pooling mode: three CLI relays drain to a local HTTP sink, then
   a relay is killed with SIGKILL mid-batch and its rows are free at once, not after the lease;
3. ``outbox-pipelines broker-sim`` faults: a 429 storm and an outage (the broker stopped, then
   started again) under two CLI relays.

Each drill checks what an on-call engineer would: every event reached the destination (exactly
once where nothing crashed; a second delivery only for the batch of a killed relay, at least once
with the same key), the table ends all ``sent``, attempts are counted as the docs say (at the
settle; not for throttling, not while the circuit is open, not for a batch whose relay died), and
the audit holds the failures and nothing for plain deliveries.

Every process is started here and stopped by its pid. Run: ``pytest -m drill
outbox_pipelines_tests/drills/test_claim_transaction_drills.py``.
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.drills import conftest as drills
from outbox_pipelines_tests.drills.conftest import RUN_QUERY, BrokerSimProcess, DrillStack
from outbox_pipelines_tests.helpers import DictConnection, order_payload, statuses
from outbox_pipelines_tests.pgbouncer import PgBouncer
from outbox_pipelines_tests.processes import free_port, kill_process, start_relay, tail, wait_until
from outbox_pipelines_tests.scratch import DEMO_PARTS

pytestmark = pytest.mark.drill

TABLE = "outbox_orders"  # shipped competing, the order broker at OUTBOX_BROKER_URL
BATCH = 10
TX_SETTINGS = 'claim = "transaction"\naudit = "failures"\n'


# -- helpers ---------------------------------------------------------------------------------------
def orders(prefix: str, n: int) -> list[Message]:
    """``n`` valid orders whose event id (the broker's Idempotency-Key) is ``<prefix><i>``."""
    messages = []
    for i in range(n):
        key = f"{prefix}{i}"
        payload = order_payload(i, key=key)
        payload["order_id"] = key
        messages.append(Message(topic="order.submitted", payload=payload, event_id=key))
    return messages


def enqueue(conn: DictConnection, messages: list[Message]) -> None:
    with conn.transaction():  # one commit: every relay sees them all at once
        Outbox(TABLE).enqueue_many(conn, messages, outside_transaction=True)


def keys(messages: list[Message]) -> set[str]:
    return {str(m.event_id) for m in messages}


def statuses_of(conn: DictConnection, prefix: str) -> dict[str, int]:
    found = conn.execute(
        f"SELECT status, count(*) AS n FROM {TABLE} WHERE event_id LIKE %s GROUP BY status", (prefix + "%",)
    ).fetchall()
    return {r["status"]: r["n"] for r in found}


def rows_of(conn: DictConnection, prefix: str) -> dict[str, dict[str, Any]]:
    found = conn.execute(f"SELECT * FROM {TABLE} WHERE event_id LIKE %s ORDER BY id", (prefix + "%",)).fetchall()
    return {r["event_id"]: r for r in found}


def audit_of(conn: DictConnection, prefix: str) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT event_id, message_id, code, error_code, from_status, to_status, attempts, worker "
        "FROM outbox_audit WHERE outbox_table = %s AND event_id LIKE %s ORDER BY id",
        (TABLE, prefix + "%"),
    ).fetchall()


def retries_by_event(audit: list[dict[str, Any]], error_code: str) -> Counter[str]:
    return Counter(a["event_id"] for a in audit if a["code"] == "outbox_flush_retry" and a["error_code"] == error_code)


def wait_all_sent(conn: DictConnection, prefix: str, n: int, timeout_s: float, extra: Any = None) -> float:
    """Seconds until the ``n`` rows of ``prefix`` are all sent."""
    started = time.monotonic()
    wait_until(
        lambda: statuses_of(conn, prefix) == {"sent": n},
        timeout_s,
        f"all {n} '{prefix}' rows sent",
        interval_s=0.1,
        on_timeout=lambda: f"statuses: {statuses_of(conn, prefix)}" + (f"\n{extra()}" if extra else ""),
    )
    return time.monotonic() - started


def unlocked_pending(conn: DictConnection, prefix: str) -> int:
    """Pending rows of ``prefix`` that a claim could take now (no transaction holds them)."""
    row = conn.execute(
        f"SELECT count(*) AS n FROM (SELECT id FROM {TABLE} WHERE event_id LIKE %s "
        "AND status = 'pending' FOR UPDATE SKIP LOCKED) AS free",
        (prefix + "%",),
    ).fetchone()
    assert row is not None
    return int(row["n"])


def write_config(path: Path, **extra: str) -> Path:
    lines = [DEMO_PARTS, f"[tables.{TABLE}]", TX_SETTINGS.strip(), *(f"{k} = {v}" for k, v in extra.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


class Relays:
    """CLI relays (``outbox-pipelines relay --json``), each named by its worker id, stopped by pid."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, env: dict[str, str], worker: str, *args: str) -> subprocess.Popen[str]:
        with (self.tmp / f"{worker}.out").open("wb") as out, (self.tmp / f"{worker}.err").open("wb") as err:
            proc = start_relay(
                env,
                TABLE,
                "--json",
                "--worker-id",
                worker,
                "--batch-size",
                str(BATCH),
                *args,
                stdout=out,
                stderr=err,
                cwd=self.tmp,
            )
        self.procs[worker] = proc
        return proc

    def stderr(self, worker: str) -> str:
        return (self.tmp / f"{worker}.err").read_text(errors="replace")

    def report(self, worker: str) -> dict[str, Any]:
        """The final report a relay printed (its last stdout line, JSON)."""
        proc = self.procs[worker]
        out = (self.tmp / f"{worker}.out").read_text().strip().splitlines()
        assert proc.returncode == 0 and out, f"relay {worker} exited {proc.returncode}:\n{self.stderr(worker)}"
        report: dict[str, Any] = json.loads(out[-1])
        return report

    def wait(self, worker: str, timeout_s: float = 60.0) -> dict[str, Any]:
        self.procs[worker].wait(timeout=timeout_s)
        return self.report(worker)

    def stop(self, worker: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """SIGTERM: the relay settles its batch in flight and prints its report."""
        proc = self.procs[worker]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return self.wait(worker, timeout_s)

    def kill(self, worker: str) -> None:
        kill_process(self.procs[worker])

    def alive(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.poll() is None]

    def logs(self) -> str:
        return "\n".join(
            f"--- {w} (exit {p.poll()}) ---\n{tail(self.tmp / f'{w}.err', 15)}" for w, p in self.procs.items()
        )

    def close(self) -> None:
        for worker in self.alive():
            proc = self.procs[worker]
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Relays]:
    harness = Relays(tmp_path)
    yield harness
    harness.close()


def live_workers(conn: DictConnection, workers: list[str]) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM outbox_relay_workers WHERE worker = ANY(%s) AND stopped_at IS NULL", (workers,)
    ).fetchone()
    assert row is not None
    return int(row["n"])


def wait_registered(conn: DictConnection, harness: Relays, workers: list[str]) -> None:
    """Until every relay has registered (it is past start-up and about to claim)."""

    def ready() -> bool:
        dead = [w for w in workers if harness.procs[w].poll() is not None]
        assert not dead, f"relays exited during start-up: {dead}\n{harness.logs()}"
        return live_workers(conn, workers) == len(workers)

    wait_until(ready, 60, f"relays {workers} to register", interval_s=0.1, on_timeout=harness.logs)


def broker_get(broker_url: str, path: str) -> Any:
    base = broker_url.rsplit("/", 1)[0]
    answer = httpx.get(base + path, timeout=5, trust_env=False)
    answer.raise_for_status()
    return answer.json()


def broker_faults(broker_url: str, **faults: Any) -> dict[str, Any]:
    base = broker_url.rsplit("/", 1)[0]
    answer = httpx.post(base + "/_faults", json=faults, timeout=5, trust_env=False)
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result


# -- 1. the Dagster relay run of `outbox-pipelines dev` ----------------------------------------------
@pytest.fixture
def tx_stack(pg_server: Any) -> Iterator[DrillStack]:
    """The drill stack (dev + broker-sim + webhook) with outbox_orders set to claim = "transaction",
    audit = "failures" through OUTBOX_CONFIG, as a user would."""

    def configure(stack: DrillStack) -> None:
        stack.dev_env["OUTBOX_CONFIG"] = str(write_config(stack.tmp / "outbox.toml"))  # dev runs with this dict

    with drills.running_stack(pg_server, configure) as stack:
        yield stack


@pytest.mark.timeout(420)
def test_dagster_relay_run_with_transaction_claim_and_failure_audit(tx_stack: DrillStack) -> None:
    stack = tx_stack
    prefix = f"drill-{stack.token}-tx-"
    plain = orders(prefix + "ok-", 40)
    flaky = orders(prefix + "flaky-", 3)  # 503 twice, then accepted: two attempts spent, audited
    throttled = orders(prefix + "slow-", 1)  # 429 Retry-After 1 s once: no attempt spent, audited
    poison = orders(prefix + "poison-", 1)  # 400: dead at once, audited
    faults = broker_faults(
        stack.broker.url,
        flaky_keys={k: 2 for k in keys(flaky)},
        rate_limited_keys={k: 1.0 for k in keys(throttled)},
        bad_keys=[stack.poison_key, *keys(poison)],
    )
    assert faults["flaky_keys"] and faults["rate_limited_keys"]
    everything = [*plain, *flaky, *throttled, *poison]
    with stack.connect() as conn:
        enqueue(conn, everything)
        t0 = time.monotonic()
        # The backlog sensor launches the table's relay run; delivered = everything settled.
        wait_until(
            lambda: statuses_of(conn, prefix) == {"sent": 44, "dead": 1},
            240,
            "the Dagster relay run to deliver every order and dead-letter the poison one",
            interval_s=0.2,
            on_timeout=lambda: f"statuses: {statuses_of(conn, prefix)}",
        )
        # Printed, not stack.record()ed: bench/drills.py tabulates fault-to-alert seconds only.
        print(f"Dagster relay run: 45 orders settled {time.monotonic() - t0:.1f}s after the enqueue")
        table_rows = rows_of(conn, prefix)
        audit = audit_of(conn, prefix)
        workers = conn.execute(
            "SELECT worker, run_id, stopped_at FROM outbox_relay_workers WHERE table_name = %s", (TABLE,)
        ).fetchall()

    # The broker executed every order once; nothing was delivered twice (no relay died).
    stats = broker_get(stack.broker.url, "/_stats")
    executed = set(broker_get(stack.broker.url, "/_executed")["keys"])
    delivered = keys([*plain, *flaky, *throttled])
    assert delivered <= executed, f"never executed: {sorted(delivered - executed)}"
    assert not keys(poison) & executed
    assert stats["repeats"] == 0, stats

    # Attempts are counted at the settle: one per delivery, one per 503, none for the 429.
    attempts = {key: row["attempts"] for key, row in table_rows.items()}
    assert {attempts[k] for k in keys(plain)} == {1}
    assert {attempts[k] for k in keys(flaky)} == {3}
    assert {attempts[k] for k in keys(throttled)} == {1}
    assert {attempts[k] for k in keys(poison)} == {1}
    assert all(
        r["published_at"] is not None and r["locked_by"] is None for k, r in table_rows.items() if k not in keys(poison)
    )
    assert table_rows[next(iter(keys(poison)))]["last_error_code"] == "BAD_REQUEST"

    # audit = "failures": no claim and no delivery in the trail; every failure is there.
    assert not [a for a in audit if a["code"] in ("outbox_claim", "outbox_flush_success")], audit
    assert retries_by_event(audit, "BROKER_5XX") == {k: 2 for k in keys(flaky)}
    assert retries_by_event(audit, "RATE_LIMITED") == {k: 1 for k in keys(throttled)}
    assert [(a["event_id"], a["error_code"]) for a in audit if a["code"] == "outbox_flush_dead"] == [
        (next(iter(keys(poison))), "BAD_REQUEST")
    ]
    assert {a["event_id"] for a in audit} == keys([*flaky, *throttled, *poison])  # plain deliveries: nothing
    # claim = "transaction": the rows were never 'sending' (no holder written), and the relay was Dagster's.
    assert {a["from_status"] for a in audit} == {"pending"}, audit
    relay_workers = {a["worker"] for a in audit}
    assert relay_workers and all(w.startswith("dagster:") for w in relay_workers), relay_workers
    runs = {w["run_id"] for w in workers if w["worker"] in relay_workers}
    assert len(runs) >= 1 and None not in runs, workers
    for run_id in runs:
        run = stack.dev.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
        assert run["jobName"] == "relay_group_default_job" and run["status"] in ("STARTED", "SUCCESS"), run


# -- 2. behind PgBouncer (transaction pooling) --------------------------------------------------------
@pytest.fixture
def bouncer(db_url: str) -> Iterator[PgBouncer]:
    pgbouncer = PgBouncer(db_url, pool_size=2)  # fewer server connections than relays
    yield pgbouncer
    pgbouncer.stop()


@pytest.mark.timeout(240)
def test_transaction_relays_behind_pgbouncer_deliver_each_event_and_a_killed_one_frees_its_rows_at_once(
    bouncer: PgBouncer, cli_env: dict[str, str], conn: DictConnection, http_sink: Any, relays: Relays, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "outbox.toml", lease='"60s"')
    env = {
        **cli_env,
        "OUTBOX_DATABASE_URL": bouncer.url,
        "OUTBOX_CONFIG": str(config),
        "OUTBOX_BROKER_URL": http_sink.url,
        "OUTBOX_IDLE_SLEEP_MS": "100",
    }

    # Three competing relays, idle and polling (LISTEN cannot pass the pooler), then 300 orders at once.
    workers = [f"pgb-{i}" for i in range(3)]
    for worker in workers:
        relays.start(env, worker, "--max-seconds", "180")
    wait_registered(conn, relays, workers)
    drain = orders("drain-", 300)
    http_sink.delay_s = 0.02  # a broker that takes a moment: the relays overlap
    enqueue(conn, drain)
    drained_s = wait_all_sent(conn, "drain-", 300, 90, extra=relays.logs)
    reports = {w: relays.stop(w) for w in workers}
    print(
        f"drained 300 behind PgBouncer with 3 relays in {drained_s:.1f}s: "
        f"{ {w: r['sent'] for w, r in reports.items()} }"
    )
    assert sum(r["sent"] for r in reports.values()) == 300
    assert sum(r["claimed"] for r in reports.values()) == 300  # no row claimed twice
    assert sum(1 for r in reports.values() if r["sent"]) >= 2, reports  # they competed
    assert not [r for r in reports.values() if r["db_errors"] or r["conflicts"] or r["retried"]], reports
    sink_counts = Counter(k for k in http_sink.keys() if k.startswith("drain-"))
    assert set(sink_counts) == keys(drain) and set(sink_counts.values()) == {1}  # each event once
    drained_rows = rows_of(conn, "drain-")
    assert {r["attempts"] for r in drained_rows.values()} == {1}
    assert audit_of(conn, "drain-") == []  # audit = "failures": 300 deliveries, no audit row

    # A relay killed mid-batch: its transaction dies with it, the rows are free at once (not after the lease).
    kill = orders("kill-", 40)
    enqueue(conn, kill)
    http_sink.delay_s = 5.0  # the victim's batch stays in flight
    relays.start(env, "pgb-victim")
    wait_until(
        lambda: len([k for k in http_sink.keys() if k.startswith("kill-")]) >= BATCH,
        60,
        "the victim's first batch to reach the sink",
        interval_s=0.05,
        on_timeout=relays.logs,
    )
    in_flight = {k for k in http_sink.keys() if k.startswith("kill-")}
    assert len(in_flight) == BATCH
    assert unlocked_pending(conn, "kill-") == 40 - BATCH  # the batch is held by the victim's open transaction
    relays.kill("pgb-victim")
    killed_at = time.monotonic()
    wait_until(
        lambda: unlocked_pending(conn, "kill-") == 40, 10, "the killed relay's rows to be claimable", interval_s=0.05
    )
    freed_s = time.monotonic() - killed_at
    print(f"rows of the killed relay claimable {freed_s * 1000:.0f} ms after SIGKILL (lease 60s)")
    assert freed_s < 5.0
    # Nothing was written for the killed attempt: pending, attempt not counted, no holder, no audit.
    assert statuses_of(conn, "kill-") == {"pending": 40}
    assert {(r["attempts"], r["locked_by"]) for r in rows_of(conn, "kill-").values()} == {(0, None)}

    http_sink.delay_s = 0.0
    survivors = ["pgb-after-1", "pgb-after-2"]
    for worker in survivors:
        relays.start(env, worker, "--once")
    after = {w: relays.wait(w, timeout_s=60) for w in survivors}
    assert sum(r["sent"] for r in after.values()) == 40, after
    assert statuses_of(conn, "kill-") == {"sent": 40}
    kill_counts = Counter(k for k in http_sink.keys() if k.startswith("kill-"))
    assert set(kill_counts) == keys(kill)
    # At least once with the same key: only the killed batch reached the sink twice.
    assert {k for k, n in kill_counts.items() if n == 2} == in_flight
    assert {n for k, n in kill_counts.items() if k not in in_flight} == {1}
    # The docs' price of claim = "transaction": the attempt that died with its relay is not counted.
    assert {r["attempts"] for r in rows_of(conn, "kill-").values()} == {1}
    assert audit_of(conn, "kill-") == []
    for worker in [*workers, *survivors]:
        assert "Traceback" not in relays.stderr(worker), relays.stderr(worker)


# -- 3. broker-sim: a 429 storm, then an outage --------------------------------------------------------
@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerSimProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
    env["PYTHONPATH"] = str(drills.REPO)
    sim = BrokerSimProcess(free_port(), tmp_path / "broker-sim.log", env, tmp_path, base_args=[])
    sim.start()
    yield sim
    sim.stop()


MAX_ATTEMPTS = 3


@pytest.mark.timeout(240)
def test_transaction_relays_through_a_429_storm_and_a_broker_outage(
    broker: BrokerSimProcess, cli_env: dict[str, str], conn: DictConnection, relays: Relays, tmp_path: Path
) -> None:
    # Three attempts at most: a message throttled or probed more often than that would be dead if it counted.
    config = write_config(tmp_path / "outbox.toml", max_attempts=str(MAX_ATTEMPTS), probe_interval='"1s"')
    env = {**cli_env, "OUTBOX_CONFIG": str(config), "OUTBOX_BROKER_URL": broker.url}
    workers = ["sim-a", "sim-b"]
    for worker in workers:
        relays.start(env, worker, "--max-seconds", "180")
    wait_registered(conn, relays, workers)

    def diagnostics() -> str:
        health = conn.execute("SELECT * FROM outbox_destination_health").fetchall()
        return f"destination health: {health}\nbroker: {broker_get(broker.url, '/_stats')}\n{relays.logs()}"

    # 429 storm: every request throttled (Retry-After 1 s) until the storm ends.
    broker_faults(broker.url, every_nth_429=1, retry_after_s=1.0)
    storm = orders("storm-", 20)
    enqueue(conn, storm)
    wait_until(
        lambda: max(retries_by_event(audit_of(conn, "storm-"), "RATE_LIMITED").values(), default=0) > MAX_ATTEMPTS,
        60,
        f"one order throttled more than {MAX_ATTEMPTS} times",
        interval_s=0.2,
        on_timeout=diagnostics,
    )
    assert statuses_of(conn, "storm-") == {"pending": 20}  # throttled, none dead, none sent
    # The pause is the table's, in the database, for both relays (each claim checks it first).
    health = conn.execute(
        "SELECT paused_until, pause_reason, circuit_opened_at FROM outbox_destination_health WHERE table_name = %s",
        (TABLE,),
    ).fetchone()
    assert health is not None and health["paused_until"] is not None and "429" in health["pause_reason"], health
    assert health["circuit_opened_at"] is None, health  # throttling is not an outage
    broker_faults(broker.url, every_nth_429=0)
    storm_s = wait_all_sent(conn, "storm-", 20, 60, extra=diagnostics)
    storm_audit = audit_of(conn, "storm-")
    throttles = retries_by_event(storm_audit, "RATE_LIMITED")
    print(
        f"429 storm: {sum(throttles.values())} throttled deliveries, at most {max(throttles.values())} for one "
        f"order; all 20 sent {storm_s:.1f}s after it ended"
    )
    assert {r["attempts"] for r in rows_of(conn, "storm-").values()} == {1}  # throttling spent no attempt
    assert {(a["code"], a["error_code"], a["from_status"]) for a in storm_audit} == {
        ("outbox_flush_retry", "RATE_LIMITED", "pending")
    }  # no claims, no deliveries, only the retries
    stats = broker_get(broker.url, "/_stats")
    # Executed once each (a 429 executes nothing), none delivered twice.
    assert set(broker_get(broker.url, "/_executed")["keys"]) == keys(storm) and stats["repeats"] == 0, stats

    # Outage: the broker stopped (connection refused), orders keep coming, then it is back on the same port.
    broker.stop()
    outage = orders("outage-", 30)
    enqueue(conn, outage)

    def circuit_open_and_probed() -> bool:
        health = conn.execute(
            "SELECT circuit_opened_at FROM outbox_destination_health WHERE table_name = %s", (TABLE,)
        ).fetchone()
        probes = retries_by_event(audit_of(conn, "outage-"), "CONNECTION_REFUSED")  # the broker is stopped
        return bool(health and health["circuit_opened_at"]) and max(probes.values(), default=0) > MAX_ATTEMPTS

    wait_until(
        circuit_open_and_probed,
        60,
        f"the circuit to open and one order to fail more than {MAX_ATTEMPTS} times",
        interval_s=0.2,
        on_timeout=diagnostics,
    )
    assert statuses_of(conn, "outage-") == {"pending": 30}  # nothing dead-lettered by the outage
    broker.start()
    back_s = wait_all_sent(conn, "outage-", 30, 30, extra=diagnostics)
    print(f"outage: all 30 orders sent {back_s:.1f}s after the broker came back")
    assert back_s < 10.0  # the circuit's probe (every 1 s) finds it, and the waiting orders are due at once
    outage_audit = audit_of(conn, "outage-")
    assert {(a["code"], a["error_code"], a["from_status"]) for a in outage_audit} == {
        ("outbox_flush_retry", "CONNECTION_REFUSED", "pending")
    }
    # Failures of a destination that is down spend no attempt (the batches that opened the circuit included).
    assert {r["attempts"] for r in rows_of(conn, "outage-").values()} == {1}

    # The restarted broker (a new process: it knows only what came after the outage) executed every
    # outage order once, and nothing came twice.
    stats = broker_get(broker.url, "/_stats")
    executed = set(broker_get(broker.url, "/_executed")["keys"])
    assert executed == keys(outage) and stats["repeats"] == 0, stats
    assert statuses(conn, TABLE) == {"sent": 50}
    reports = {w: relays.stop(w) for w in workers}
    assert sum(r["sent"] for r in reports.values()) == 50, reports
    assert not [r for r in reports.values() if r["dead"] or r["db_errors"] or r["conflicts"]], reports
