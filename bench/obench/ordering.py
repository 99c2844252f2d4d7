"""ordering: what ordering keys cost, and that one key never holds up the rest (issue 24).

Same run, rounds interleaved (the order rotates each round), 4 relay processes at default settings
(competing, batch 100, claim auto: held, full audit), run_table_relay with a no-op destination:

- keyed drain: N messages over 10,000 keys (N / 10,000 each, interleaved as writes arrive) against the
  same N without keys. Target >= 0.8x (issue 47).
- beside a blocked key: the keyed load plus one key whose head is dead and 1,000 messages wait behind
  it, against the keyed load alone. Target >= 0.9x. Beside 100 blocked keys: the same with 100 such keys
  (100,000 waiting; issue 47). Target >= 0.9x.
- beside hot keys: N / 10 messages of their own keys beside 10 hot keys holding 9 N / 10 (90 %), the
  healthy messages' rate (from the first claim to the last of them delivered) against the same healthy
  messages alone. Target >= 0.9x.

Then commit -> handler at the latency scenario's rate with keys (100 keys) and without, a Relay on
the shipped outbox_events settings; and the claim's plan and time at 1,000,000 pending messages over
100,000 keys against 1,000,000 without keys (EXPLAIN ANALYZE, median of 5 claims rolled back).
"""

import statistics
import time
from typing import Any

import psycopg

from obench.common import (
    DEADLINE_FACTOR,
    DEADLINE_SLACK_S,
    PRODUCER_HEAD_START_S,
    Barrier,
    Figure,
    NoopDestination,
    ScenarioResult,
    Sizes,
    Target,
    latency_summary,
    log,
    reset_table,
    run_processes,
    settle_server,
)
from obench.latency import TABLE as LATENCY_TABLE
from obench.latency import keyed_producer, ours_consumer

TABLE = "outbox_orders"
WORKERS = 4
KEYS = 10_000
HOT_KEYS = 10
BLOCKED_BEHIND = 1_000
BLOCKED_KEYS = 100  # hot keys, each blocked by a dead head with BLOCKED_BEHIND waiting (issue 47)

# Rows loaded the way enqueue leaves them: whether a keyed message waits (ordering_blocked) is the table's insert
# trigger's to say, whatever the INSERT writes (migrations 0018, 0027). n: the position; key: its ordering key or NULL.
LOAD = """
INSERT INTO {table} (event_id, topic, payload, payload_sha, headers, ordering_key)
SELECT %(prefix)s || n, 'bench.ordering', jsonb_build_object('n', n), 'sha-' || n, '{{}}'::jsonb, k.key
FROM generate_series(1, %(count)s) AS n
CROSS JOIN LATERAL (SELECT CASE
    WHEN %(keys)s = 0 THEN NULL
    WHEN %(hot_share)s > 0 AND n %% 10 < %(hot_share)s THEN 'hot-' || (n %% %(hot_keys)s)
    ELSE %(key_prefix)s || (n %% %(keys)s) END AS key) AS k
ORDER BY n
"""


def _load(url: str, prefix: str, count: int, *, keys: int, key_prefix: str = "k-", hot_share: int = 0) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            LOAD.format(table=TABLE),
            {
                "prefix": prefix,
                "count": count,
                "keys": keys,
                "key_prefix": key_prefix,
                "hot_share": hot_share,
                "hot_keys": HOT_KEYS,
            },
        )


def _block_a_key(url: str, keys: int = 1) -> None:
    """``keys`` keys whose head died (BAD_REQUEST), BLOCKED_BEHIND messages waiting behind each."""
    _load(url, "stuck-", (BLOCKED_BEHIND + 1) * keys, keys=keys, key_prefix="stuck-")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {TABLE} SET status = 'dead', last_error_code = 'BAD_REQUEST' "  # constant
            f"WHERE id IN (SELECT min(id) FROM {TABLE} WHERE ordering_key LIKE 'stuck-%' GROUP BY ordering_key)"
        )


def drain_worker(url: str, index: int, barrier: Barrier) -> Any:
    """Relay until nothing is ready (a keyed drain releases as it goes: one pass may end early)."""
    from outbox_pipelines.core.relay import run_table_relay
    from outbox_pipelines.core.settings import GlobalSettings, Settings, TableSettings

    table = TableSettings(name=TABLE, mode="competing", on_success="mark_sent")
    settings = Settings(GlobalSettings.from_env({}), {TABLE: table}, None)
    with psycopg.connect(url, autocommit=True) as conn:
        barrier()
        started = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        sent = 0
        while True:
            sent += run_table_relay(
                url, settings, TABLE, once=True, worker_id=f"bench-ordering-{index}", destination=NoopDestination()
            ).sent
            left = conn.execute(
                f"SELECT count(*) FROM {TABLE} WHERE status IN ('pending', 'sending') AND NOT ordering_blocked"
            ).fetchone()[0]  # type: ignore[index]
            if not left:
                return started, sent


# Which messages a drain's rate counts (constants, never input).
MEASURED = {
    "keyed beside a blocked key": "coalesce(ordering_key, '') NOT LIKE 'stuck-%'",
    "keyed beside 100 blocked keys": "coalesce(ordering_key, '') NOT LIKE 'stuck-%'",
    "healthy beside hot keys": "ordering_key NOT LIKE 'hot-%'",
}


def drain(url: str, load: str, messages: int) -> float:
    """Load, drain with WORKERS processes; msg/s of the measured messages (first claim -> last delivered)."""
    reset_table(url, TABLE)
    if load == "unkeyed":
        _load(url, "u-", messages, keys=0)
    elif load in ("keyed", "keyed beside a blocked key", "keyed beside 100 blocked keys"):
        _load(url, "k-", messages, keys=KEYS)
        if load != "keyed":
            _block_a_key(url, BLOCKED_KEYS if load == "keyed beside 100 blocked keys" else 1)
    elif load == "healthy alone":
        _load(url, "h-", messages // 10, keys=messages // 10)
    elif load == "healthy beside hot keys":
        _load(url, "h-", messages, keys=messages, hot_share=9)
    settle_server(url, TABLE)
    results = run_processes([(drain_worker, (url, i)) for i in range(WORKERS)], timeout_s=1800)
    started = min(r[0] for r in results)
    measured = MEASURED.get(load, "true")
    with psycopg.connect(url, autocommit=True) as conn:
        count, unsent, last = conn.execute(
            f"SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status <> 'sent'), "
            f"max(published_at) FROM {TABLE} WHERE {measured}"
        ).fetchone()  # type: ignore[misc]
    if unsent:
        raise RuntimeError(f"ordering drain {load}: {unsent} messages not sent")
    return count / (last - started).total_seconds()


DRAINS = (
    "unkeyed",
    "keyed",
    "keyed beside a blocked key",
    "keyed beside 100 blocked keys",
    "healthy alone",
    "healthy beside hot keys",
)
COMPARED = (
    (
        "keyed",
        "unkeyed",
        f"keyed drain ({KEYS:,} keys)",
        Target("≥ 0.8× the same messages without keys", ratio_min=0.8),
        "the same messages without keys",
    ),
    (
        "keyed beside a blocked key",
        "keyed",
        f"keyed drain beside a blocked key ({BLOCKED_BEHIND:,} waiting)",
        Target("≥ 0.9× without the blocked key", ratio_min=0.9),
        "the keyed drain without the blocked key",
    ),
    (
        "keyed beside 100 blocked keys",
        "keyed",
        f"keyed drain beside {BLOCKED_KEYS} blocked keys ({BLOCKED_BEHIND:,} waiting each)",
        Target("≥ 0.9× without the blocked keys", ratio_min=0.9),
        "the keyed drain without the blocked keys",
    ),
    (
        "healthy beside hot keys",
        "healthy alone",
        f"10 % healthy keys beside {HOT_KEYS} hot keys holding 90 %",
        Target("≥ 0.9× the healthy messages alone", ratio_min=0.9),
        "the healthy messages alone",
    ),
)


def latency(url: str, sizes: Sizes, keys: int) -> dict[str, Any]:
    reset_table(url, LATENCY_TABLE)
    settle_server(url, LATENCY_TABLE)
    expected = int(sizes.latency_rate * sizes.latency_seconds)
    deadline_s = PRODUCER_HEAD_START_S + sizes.latency_seconds * DEADLINE_FACTOR + DEADLINE_SLACK_S
    results = run_processes(
        [
            (ours_consumer, (url, expected, deadline_s)),
            (keyed_producer, (url, sizes.latency_rate, sizes.latency_seconds, keys)),
        ],
        timeout_s=deadline_s + 60,
    )
    committed = next(r[1] for r in results if r[0] == "producer")
    delivered = next(r[1] for r in results if r[0] == "consumer")
    summary = latency_summary(committed, delivered, sizes.latency_rate)
    if summary["missing"]:
        raise RuntimeError(f"ordering latency keys={keys}: {summary['missing']} messages never delivered")
    return summary


CLAIM_PARAMS: dict[str, Any] = {
    "table_name": TABLE,
    "worker": "bench-plan",
    "limit": 100,
    "lease_s": 30.0,
    "paused_topics": [],
    "max_attempts": 2**31 - 1,
    "audit_claims": True,
    "fast_commit": False,
    "gated": False,
    "now": None,
    "max_bytes": 64 * 1024 * 1024,
}


def _explain_claim(conn: psycopg.Connection) -> list[str]:
    """EXPLAIN ANALYZE of the claim as the relay sends it (it runs: the caller rolls it back)."""
    from outbox_pipelines.core.storage.queries import table_query

    statement = table_query("outbox_claim", TABLE)
    params = {name: value for name, value in CLAIM_PARAMS.items() if f"%({name})s" in statement}
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, params).fetchall()
    return [row[0] for row in rows]


def claim_cost(url: str, pending: int, keys: int) -> dict[str, Any]:
    """The claim of 100 at ``pending`` messages over ``keys`` keys (0: none): its plan and its time."""
    from outbox_pipelines.core.storage.table import OutboxTable

    reset_table(url, TABLE)
    _load(url, "c-", pending, keys=keys)
    settle_server(url, TABLE)
    times = []
    with psycopg.connect(url) as conn:
        for _ in range(5):
            started = time.perf_counter()
            claimed = OutboxTable(conn, TABLE).claim("bench-plan", 100, 30.0)
            times.append((time.perf_counter() - started) * 1000)
            conn.rollback()
            if len(claimed) != 100:
                raise RuntimeError(f"claim at {pending:,} pending: {len(claimed)} rows")
        plan = _explain_claim(conn)
        conn.rollback()
    return {"claim_ms": statistics.median(times), "claim_ms_runs": times, "plan": plan}


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    result = ScenarioResult()
    messages = sizes.drain_messages // 2
    rates: dict[str, list[float]] = {load: [] for load in DRAINS}
    for run_index in range(runs):
        shift = run_index % len(DRAINS)
        for load in DRAINS[shift:] + DRAINS[:shift]:
            rate = drain(url, load, messages)
            rates[load].append(rate)
            log(f"  ordering run {run_index + 1}/{runs} {load:28s} {rate:9,.0f} msg/s")
    for ours, reference, label, target, reference_label in COMPARED:
        result.figures.append(
            Figure(
                "ordering",
                f"{label}, {WORKERS} relays at default settings, {messages:,} msgs",
                "msg/s",
                rates[ours],
                rates[reference],
                reference_label,
                target,
            )
        )
    result.details["drain_msg_per_s"] = rates

    stats: dict[str, list[dict[str, Any]]] = {"keyed": [], "unkeyed": []}
    for run_index in range(runs):
        for kind in ("keyed", "unkeyed") if run_index % 2 == 0 else ("unkeyed", "keyed"):
            m = latency(url, sizes, 100 if kind == "keyed" else 0)
            stats[kind].append(m)
            log(
                f"  ordering latency run {run_index + 1}/{runs} {kind:8s} p50 {m['p50']:6.2f} ms  "
                f"p99 {m['p99']:6.2f} ms"
            )
    for quantile in ("p50", "p99"):
        result.figures.append(
            Figure(
                "ordering",
                f"latency commit→handler at {sizes.latency_rate:.0f} msg/s over 100 keys: {quantile}",
                "ms",
                [m[quantile] for m in stats["keyed"]],
                [m[quantile] for m in stats["unkeyed"]],
                "the same without keys",
                note="for information",
            )
        )
    result.details["latency"] = stats

    pending = sizes.flat_messages
    keyed_cost = claim_cost(url, pending, pending // 10)
    plain_cost = claim_cost(url, pending, 0)
    result.figures.append(
        Figure(
            "ordering",
            f"claim of 100 at {pending:,} pending over {pending // 10:,} keys",
            "ms",
            keyed_cost["claim_ms_runs"],
            plain_cost["claim_ms_runs"],
            f"the claim at {pending:,} pending without keys",
            note="for information",
        )
    )
    result.details["claim_plan_keyed"] = keyed_cost["plan"]
    result.details["claim_plan_unkeyed"] = plain_cost["plan"]
    return result
