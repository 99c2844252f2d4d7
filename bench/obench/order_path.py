"""order: POST /do/order through to the broker simulator, with the real processes.

``outbox-pipelines broker-sim`` and ``outbox-pipelines order-api`` (one uvicorn
worker, OUTBOX_API_RATE_PER_MINUTE far above any load here) run as subprocesses on this
scenario's database; the load comes from a spawned process with an
``httpx.AsyncClient``.

1. Throughput: unique valid orders (OrderRequest v1.1), 32 in flight, for ~10 s;
   accepted (201) orders/s. No relay runs meanwhile, so the API has the machine
   (minus the load generator and PostgreSQL).
2. Latency at 100 orders/s for ~30 s, accepted → executed, with the relay as the
   CLI worker (``outbox-pipelines relay --table outbox_orders``,
   OUTBOX_BROKER_URL pointing at the sim), then as the Dagster job
   (``outbox-pipelines dev`` with the same OUTBOX_BROKER_URL: the
   ``relay_group_default_job`` runs its schedule and backlog sensor start).

   Latency is database time: ``idempo_ledger.created_at`` (start of the API's
   accept transaction) to ``idempo_ledger.updated_at`` once status is
   'succeeded' (start of the relay's settle transaction, which records the
   ExecResult right after the broker answered): an *upper bound* of accepted →
   executed.
"""

import asyncio
import os
import time
from typing import Any

import psycopg

from obench.common import Barrier, Figure, ScenarioResult, Sizes, Target, log, percentile, run_processes
from obench.dagster_steady import DagsterDev, free_port, is_quick, start_cli, stop_cli, wait_http

TABLE = "outbox_orders"
INFLIGHT = 32
# The API refuses OUTBOX_API_RATE_PER_MINUTE=0 (limits must be whole positive numbers): a limit per
# client that no load here comes near measures the API without throttling.
NO_RATE_LIMIT = "1000000000"


def order(i: int, key: str) -> dict[str, Any]:
    """A valid OrderRequest v1.1 (as outbox_pipelines_tests/helpers.py order_payload)."""
    return {
        "order_id": f"ord-{i}",
        "instrument": "USDJPY",
        "side": "BUY" if i % 2 else "SELL",
        "qty": 0.1,
        "price": None,
        "time_in_force": "IOC",
        "tags": [],
        "idempotency_key": key,
        "requested_at": "2026-01-01T00:00:00Z",
    }


async def _post(client: Any, i: int, prefix: str) -> int:
    key = f"{prefix}-{i}"
    try:
        r = await client.post("/do/order", json=order(i, key), headers={"Idempotency-Key": key})
        return r.status_code
    except Exception:
        return -1


def blast(api: str, seconds: float, inflight: int, prefix: str, barrier: Barrier) -> dict[str, Any]:
    """(spawned) As many orders as the API accepts, `inflight` at a time, for `seconds`."""
    import httpx

    async def main() -> dict[str, Any]:
        counter = iter(range(10**9))
        statuses: dict[int, int] = {}
        async with httpx.AsyncClient(
            base_url=api, timeout=30.0, limits=httpx.Limits(max_connections=inflight)
        ) as client:
            await _post(client, next(counter), prefix + "w")  # connect once before the clock
            barrier()
            start = time.monotonic()
            deadline = start + seconds

            async def worker() -> None:
                while time.monotonic() < deadline:
                    code = await _post(client, next(counter), prefix)
                    statuses[code] = statuses.get(code, 0) + 1

            await asyncio.gather(*(worker() for _ in range(inflight)))
            elapsed = time.monotonic() - start
        return {"seconds": elapsed, "statuses": statuses, "accepted_per_s": statuses.get(201, 0) / elapsed}

    return asyncio.run(main())


def paced(api: str, rate: float, seconds: float, prefix: str, barrier: Barrier) -> dict[str, Any]:
    """(spawned) One order every 1/rate s on an absolute schedule, each in its own task."""
    import httpx

    async def main() -> dict[str, Any]:
        statuses: dict[int, int] = {}
        count = int(rate * seconds)
        async with httpx.AsyncClient(base_url=api, timeout=30.0, limits=httpx.Limits(max_connections=64)) as client:
            barrier()
            start = time.monotonic()
            tasks = []
            for i in range(count):
                pause = start + i / rate - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                tasks.append(asyncio.create_task(_post(client, i, prefix)))
            for code in await asyncio.gather(*tasks):
                statuses[code] = statuses.get(code, 0) + 1
            elapsed = time.monotonic() - start
        return {"count": count, "seconds": elapsed, "statuses": statuses, "achieved_rate": count / elapsed}

    return asyncio.run(main())


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox_orders, idempo_ledger, outbox_audit RESTART IDENTITY")
        conn.execute("VACUUM ANALYZE outbox_orders")
        conn.execute("VACUUM ANALYZE idempo_ledger")


def ledger_latency(url: str, prefix: str, timeout_s: float = 90.0) -> dict[str, Any]:
    """Wait until the orders of `prefix` are settled in the ledger; accepted → succeeded latencies."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            left = conn.execute(
                "SELECT count(*) FROM idempo_ledger WHERE status = 'accepted' AND idempotency_key LIKE %s",
                (prefix + "-%",),
            ).fetchone()[0]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        rows = conn.execute(
            "SELECT status, extract(epoch FROM updated_at - created_at)::float8 FROM idempo_ledger "
            "WHERE idempotency_key LIKE %s",
            (prefix + "-%",),
        ).fetchall()
        outbox = dict(conn.execute("SELECT status, count(*) FROM outbox_orders GROUP BY status").fetchall())
    values = [v for s, v in rows if s == "succeeded"]
    return {
        "orders": len(rows),
        "succeeded": len(values),
        "not_settled": int(left),
        "ledger_statuses": {s: sum(1 for r in rows if r[0] == s) for s in {r[0] for r in rows}},
        "outbox_statuses": {k: int(v) for k, v in outbox.items()},
        "p50_ms": percentile(values, 50) * 1000,
        "p95_ms": percentile(values, 95) * 1000,
        "p99_ms": percentile(values, 99) * 1000,
        "max_ms": max(values) * 1000 if values else float("nan"),
    }


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    quick = is_quick(sizes)
    blast_s, rate, paced_s = (3.0, 100.0, 10.0) if quick else (10.0, 100.0, 30.0)
    cwd = __import__("pathlib").Path(__file__).resolve().parent.parent / ".runs"
    cwd.mkdir(exist_ok=True)
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "OUTBOX_API_RATE_PER_MINUTE": NO_RATE_LIMIT}
    env.pop("OUTBOX_CONFIG", None)
    broker_port, api_port = free_port(), free_port()
    broker_url = f"http://127.0.0.1:{broker_port}/orders"
    api = f"http://127.0.0.1:{api_port}"
    env_relay = {**env, "OUTBOX_BROKER_URL": broker_url}
    broker = start_cli(["broker-sim", "--port", str(broker_port)], env, "order-broker-sim", cwd)
    api_proc = start_cli(["order-api", "--port", str(api_port)], env, "order-api", cwd)
    details: dict[str, Any] = {"blast_seconds": blast_s, "inflight": INFLIGHT, "rate": rate, "paced_seconds": paced_s}
    try:
        if not wait_http(api + "/healthz", api_proc, 60) or not wait_http(broker_url, broker, 30):
            raise RuntimeError("order-api or broker-sim did not come up (see bench/.runs/order-*.log)")
        # 1. throughput
        thr = []
        for n in range(runs):
            reset(url)
            (res,) = run_processes([(blast, (api, blast_s, INFLIGHT, f"thr{n}"))], timeout_s=blast_s + 120)
            thr.append(res)
            log(f"  throughput run {n + 1}/{runs}: {res['accepted_per_s']:.0f} accepted orders/s ({res['statuses']})")
        details["throughput"] = thr
        # 2. latency, CLI relay
        cli = []
        for n in range(runs):
            reset(url)
            relay = start_cli(["relay", "--table", TABLE, "--quiet"], env_relay, "order-relay", cwd)
            try:
                time.sleep(3.0)  # imports, connection, LISTEN
                prefix = f"cli{n}"
                (load,) = run_processes([(paced, (api, rate, paced_s, prefix))], timeout_s=paced_s + 120)
                lat = ledger_latency(url, prefix)
            finally:
                stop_cli(relay, grace_s=30)
            cli.append({"load": load, **lat})
            log(
                f"  CLI relay run {n + 1}/{runs}: p50 {lat['p50_ms']:.1f} ms, p95 {lat['p95_ms']:.1f} ms, "
                f"p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.0f} ms; {lat['succeeded']}/{lat['orders']} succeeded "
                f"at {load['achieved_rate']:.0f} orders/s ({load['statuses']})"
            )
        details["cli"] = cli
        # 3. latency, Dagster job (once: one `dagster dev` start-up costs ~30 s)
        reset(url)
        dev = DagsterDev(url, "order", extra_env={"OUTBOX_BROKER_URL": broker_url})
        try:
            dev.wait_ready()
            (warm,) = run_processes([(paced, (api, 1.0, 1.0, "dwarm"))], timeout_s=60)
            worker = dev.wait_run_claimed(TABLE)
            log(f"  Dagster relay run {worker} is relaying {TABLE}")
            (load,) = run_processes([(paced, (api, rate, paced_s, "dag"))], timeout_s=paced_s + 120)
            lat = ledger_latency(url, "dag")
        finally:
            dev.stop()
        details["dagster"] = {"load": load, **lat}
        log(
            f"  Dagster relay: p50 {lat['p50_ms']:.1f} ms, p95 {lat['p95_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, "
            f"max {lat['max_ms']:.0f} ms; {lat['succeeded']}/{lat['orders']} succeeded"
        )
    finally:
        stop_cli(api_proc, grace_s=15)
        stop_cli(broker, grace_s=15)
    figures = [
        Figure(
            "order",
            f"order: POST /do/order accepted (201) per s, 1 uvicorn worker, {INFLIGHT} in flight",
            "req/s",
            [r["accepted_per_s"] for r in thr],
        ),
        Figure(
            "order",
            f"order: accepted → executed at {rate:.0f} orders/s, CLI relay, p50",
            "ms",
            [r["p50_ms"] for r in cli],
        ),
        Figure(
            "order",
            f"order: accepted → executed at {rate:.0f} orders/s, CLI relay, p99",
            "ms",
            [r["p99_ms"] for r in cli],
            target=Target("p99 <= 50 ms", value_max=50.0),
        ),
        Figure(
            "order",
            f"order: accepted → executed at {rate:.0f} orders/s, Dagster job, p50",
            "ms",
            [details["dagster"]["p50_ms"]],
        ),
        Figure(
            "order",
            f"order: accepted → executed at {rate:.0f} orders/s, Dagster job, p99",
            "ms",
            [details["dagster"]["p99_ms"]],
        ),
    ]
    return ScenarioResult(figures=figures, details=details)


def detail_lines(d: dict[str, Any]) -> list[str]:
    lines = [
        "- **order** throughput per run (accepted 201/s, status counts): "
        + "; ".join(f"{r['accepted_per_s']:.0f}/s {r['statuses']}" for r in d["throughput"])
        + f". {d['inflight']} in flight from one spawned httpx.AsyncClient process on the same 2 cores, "
        f"no relay running; rate limit out of reach (OUTBOX_API_RATE_PER_MINUTE={NO_RATE_LIMIT})."
    ]
    for label, runs in (("CLI relay", d["cli"]), ("Dagster job", [d["dagster"]])):
        for r in runs:
            lines.append(
                f"  {label}: {r['succeeded']}/{r['orders']} succeeded at {r['load']['achieved_rate']:.0f} orders/s "
                f"(HTTP {r['load']['statuses']}); accepted → executed p50 {r['p50_ms']:.1f}, p95 {r['p95_ms']:.1f}, "
                f"p99 {r['p99_ms']:.1f}, max {r['max_ms']:.0f} ms; outbox {r['outbox_statuses']}."
            )
    lines.append(
        "  Latency is idempo_ledger.created_at (start of the accept transaction) → updated_at when status becomes "
        "'succeeded' (start of the relay's settle transaction after the broker answered): an upper bound."
    )
    return lines
