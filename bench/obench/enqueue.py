"""enqueue: a one-row business transaction plus its outbox row, one commit each.

Ours: ``Outbox("outbox_events").enqueue(conn, Message(...))`` beside the
business INSERT. Ceiling: the same transaction with the outbox row written by a
plain parameterised INSERT whose payload text and digest were computed before
the clock started. Both on a psycopg connection and on a SQLAlchemy Connection
(``engine.begin()``).

The four variants take turns transaction by transaction (in a rotating order),
so a slow patch of WAL flushes hits all of them alike; the figure is the mean
time per transaction (total time / transactions), which is what bounds an
application. The medians per transaction are kept in the details.
"""

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from obench import ceiling_sql
from obench.common import (
    Figure,
    ScenarioResult,
    Sizes,
    Target,
    log,
    percentile,
    reset_table,
    sample_payload,
    settle_server,
)
from outbox_pipelines.core.canonical import canonical_json, digest
from outbox_pipelines.core.db import sqlalchemy_url
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.store import Outbox

TABLE = "outbox_events"
TOPIC = "order.created"
WARM_UP = 20
BUSINESS_DDL = "CREATE TABLE IF NOT EXISTS orders_biz (id bigserial PRIMARY KEY, body jsonb NOT NULL)"
BUSINESS_INSERT = "INSERT INTO orders_biz (body) VALUES (%s)"
VARIANTS = ("psycopg-ours", "psycopg-plain", "sqlalchemy-ours", "sqlalchemy-plain")


def _messages(count: int, tag: str) -> list[tuple[dict[str, Any], Message, tuple[str, str, str, str, str]]]:
    """Per transaction: the business body, our Message, and the plain INSERT's parameters."""
    prepared = []
    for n in range(count):
        body = sample_payload(n)
        event_id = f"{tag}-{n}-{uuid.uuid4().hex[:8]}"
        headers = {"trace_id": uuid.uuid4().hex}
        text = canonical_json(body)
        message = Message(topic=TOPIC, payload=body, event_id=event_id, headers=headers)
        prepared.append((body, message, (event_id, TOPIC, text, digest(text), canonical_json(headers))))
    return prepared


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    from sqlalchemy import create_engine, text

    result = ScenarioResult()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BUSINESS_DDL)
    outbox = Outbox(TABLE)
    plain_sql = ceiling_sql.bind(ceiling_sql.PLAIN_INSERT, TABLE)
    sa_business = text("INSERT INTO orders_biz (body) VALUES (CAST(:body AS jsonb))")
    sa_plain = text(
        'INSERT INTO "outbox_events" (event_id, topic, payload, payload_sha, headers) '
        "VALUES (:event_id, :topic, CAST(:payload AS jsonb), :payload_sha, CAST(:headers AS jsonb))"
    )
    # One pooled connection, as a web worker would hold; pre_ping off so each
    # transaction costs exactly its own round trips.
    engine = create_engine(sqlalchemy_url(url), pool_size=1, max_overflow=0)
    per_txn: dict[str, list[float]] = {v: [] for v in VARIANTS}
    p50_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        with psycopg.connect(url) as pg:
            for run_index in range(runs):
                reset_table(url, TABLE)
                with psycopg.connect(url, autocommit=True) as admin:
                    admin.execute("TRUNCATE orders_biz")
                settle_server(url, TABLE, "orders_biz")
                work = {v: _messages(sizes.enqueue_transactions, f"{v}-r{run_index}") for v in VARIANTS}
                spent = {v: 0.0 for v in VARIANTS}

                def psycopg_ours(item: Any) -> None:
                    body, message, _ = item
                    with pg.cursor() as cur:
                        cur.execute(BUSINESS_INSERT, (Jsonb(body),))
                    outbox.enqueue(pg, message)
                    pg.commit()

                def psycopg_plain(item: Any) -> None:
                    body, _, params = item
                    with pg.cursor() as cur:
                        cur.execute(BUSINESS_INSERT, (Jsonb(body),))
                        cur.execute(plain_sql, params)
                    pg.commit()

                def sqlalchemy_ours(item: Any) -> None:
                    _, message, params = item
                    with engine.begin() as conn:
                        conn.execute(sa_business, {"body": params[2]})
                        outbox.enqueue(conn, message)

                def sqlalchemy_plain(item: Any) -> None:
                    _, _, params = item
                    with engine.begin() as conn:
                        conn.execute(sa_business, {"body": params[2]})
                        conn.execute(
                            sa_plain,
                            {"event_id": params[0], "topic": params[1], "payload": params[2],
                             "payload_sha": params[3], "headers": params[4]},
                        )

                one_txn: dict[str, Callable[[Any], None]] = {
                    "psycopg-ours": psycopg_ours,
                    "psycopg-plain": psycopg_plain,
                    "sqlalchemy-ours": sqlalchemy_ours,
                    "sqlalchemy-plain": sqlalchemy_plain,
                }
                # Warm both connections (and psycopg's statement preparation) outside the clock.
                for variant in VARIANTS:
                    for item in _messages(WARM_UP, f"warm-{variant}-r{run_index}"):
                        one_txn[variant](item)
                samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for n in range(sizes.enqueue_transactions):
                    # One transaction of each variant in turn, in a rotating order: a
                    # slow patch of WAL flushes lands on all four alike.
                    shift = n % len(VARIANTS)
                    for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                        t0 = time.perf_counter()
                        one_txn[variant](work[variant][n])
                        samples[variant].append(time.perf_counter() - t0)
                for variant in VARIANTS:
                    spent[variant] = sum(samples[variant])
                    p50_ms[variant].append(percentile(samples[variant], 50) * 1000.0)
                for variant in VARIANTS:
                    per_txn[variant].append(spent[variant] / sizes.enqueue_transactions * 1000.0)
                log(
                    f"  enqueue run {run_index + 1}/{runs}: "
                    + ", ".join(f"{v} {per_txn[v][-1]:.3f} ms/txn" for v in VARIANTS)
                )
            with pg.cursor() as cur:
                cur.execute("SELECT count(*) FROM outbox_events")
                stored = cur.fetchone()[0]  # type: ignore[index]
            pg.commit()
    finally:
        engine.dispose()
    expected = len(VARIANTS) * (sizes.enqueue_transactions + WARM_UP)
    if stored != expected:
        raise RuntimeError(f"enqueue: {stored} outbox rows after the last run, expected {expected}")
    n = sizes.enqueue_transactions
    result.figures.append(
        Figure(
            "enqueue",
            f"enqueue, psycopg connection ({n:,} one-row txns)",
            "ms/txn",
            per_txn["psycopg-ours"],
            per_txn["psycopg-plain"],
            "same txn, plain INSERT of the outbox row",
            Target("≤ 1.15× ceiling", ratio_max=1.15),
        )
    )
    result.figures.append(
        Figure(
            "enqueue",
            f"enqueue, SQLAlchemy engine.begin() ({n:,} one-row txns)",
            "ms/txn",
            per_txn["sqlalchemy-ours"],
            per_txn["sqlalchemy-plain"],
            "same txn, plain INSERT through SQLAlchemy",
            Target("≤ 1.15× ceiling", ratio_max=1.15),
            note="reported for information; the target is set for the psycopg path",
        )
    )
    result.details["mean_ms_per_txn"] = per_txn
    result.details["p50_ms_per_txn"] = p50_ms
    return result
