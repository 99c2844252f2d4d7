"""Where the one-row enqueue's time goes: each clause of its statement, and each step around it.

Three probes, each printing a Markdown table for bench/results.md (issue 28's fifth pass):

1. **Statement shapes, call by call.** The plain INSERT of the enqueue scenario's reference, with
   ``ON CONFLICT (event_id) DO NOTHING``, with ``RETURNING id`` as well (text and binary results), and as a
   CTE, taking turns call by call inside the same transactions: the median wall time of one execute and
   the read of its result.
2. **The same clauses inside the server**: a PL/pgSQL loop of INSERTs of each shape, no round trip.
3. **Whole transactions, as the bench measures them** (``obench/enqueue.py``: the business INSERT, the
   outbox row, the commit; blocks of 25 in a shuffled order): the plain INSERT with ``json.dumps`` and
   ``sha256``, then one step of ``Outbox.enqueue`` added at a time, up to ``Outbox.enqueue`` itself.

All three run with ``synchronous_commit = off``, so that the WAL flush (the same for every variant) does
not drown differences of a few microseconds.

Run: ``.venv/bin/python bench/obench/enqueue_breakdown.py [--rounds N]`` (it starts its own embedded
PostgreSQL, or uses OUTBOX_BENCH_DATABASE_URL; about two minutes at the default 12 rounds).
"""

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from obench import ceiling_sql
from obench.common import BenchServer, sample_payload
from obench.enqueue import BLOCK, BUSINESS_DDL, BUSINESS_INSERT, TABLE, TOPIC
from outbox_pipelines.core.enqueue import Outbox, _prepare_one
from outbox_pipelines.core.models import EnqueueResult, Message
from outbox_pipelines.core.storage.queries import table_query
from outbox_pipelines.core.telemetry.metrics import count_enqueued_one

PLAIN = ceiling_sql.PLAIN_INSERT.strip()
ON_CONFLICT = " ON CONFLICT (event_id) DO NOTHING"
SHAPES = {
    "plain INSERT": PLAIN,
    "+ ON CONFLICT (event_id) DO NOTHING": PLAIN + ON_CONFLICT,
    "+ ON CONFLICT … RETURNING id": PLAIN + ON_CONFLICT + " RETURNING id",
    "the same, results in binary": PLAIN + ON_CONFLICT + " RETURNING id",
    "the same as WITH i AS (INSERT …) SELECT id FROM i": (
        f"WITH i AS ({PLAIN}{ON_CONFLICT} RETURNING id) SELECT id FROM i"
    ),
}
SERVER_LOOP_ROWS = 20_000
SERVER_SHAPES = {
    "plain INSERT": "",
    "+ ON CONFLICT": " ON CONFLICT (event_id) DO NOTHING",
    "+ ON CONFLICT … RETURNING id INTO": " ON CONFLICT (event_id) DO NOTHING RETURNING id INTO kept",
}
TRANSACTIONS = 2_000


def _message(n: int, tag: str) -> Message:
    return Message(
        topic=TOPIC, payload=sample_payload(n), event_id=f"{tag}-{n}-{uuid.uuid4().hex[:8]}", headers={"t": tag}
    )


def _plain_params(message: Message) -> tuple[str, str, str, str, str]:
    """What an application writing the row by hand computes in its transaction (the bench's reference)."""
    payload = json.dumps(message.payload)
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return (message.event_id or "", message.topic, payload, digest, json.dumps(message.headers))


def statement_shapes(url: str, calls: int) -> dict[str, float]:
    """Median µs of one execute (and its result read) per shape, the shapes taking turns call by call."""
    statements = {name: ceiling_sql.bind(text, TABLE) for name, text in SHAPES.items()}
    times: dict[str, list[float]] = {name: [] for name in SHAPES}
    order = random.Random(3)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        for n in range(calls + 20):
            for name in order.sample(list(SHAPES), len(SHAPES)):
                params = _plain_params(_message(n, f"shape{list(SHAPES).index(name)}"))
                t0 = time.perf_counter()
                cur.execute(statements[name], params, binary="binary" in name)
                if "RETURNING" in SHAPES[name]:
                    cur.fetchone()
                elapsed = time.perf_counter() - t0
                if n >= 20:  # psycopg prepares a statement at its fifth execution: time the prepared ones
                    times[name].append(elapsed)
            if n % 20 == 19:
                conn.commit()
        conn.commit()
    return {name: statistics.median(samples) * 1e6 for name, samples in times.items()}


def server_loop(url: str, rounds: int) -> dict[str, list[float]]:
    """µs a row of a PL/pgSQL loop of INSERTs of each shape: the clauses' cost inside the server."""
    per_row: dict[str, list[float]] = {name: [] for name in SERVER_SHAPES}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS loop_probe (id bigserial PRIMARY KEY, event_id text UNIQUE NOT NULL)")
        for _ in range(rounds):
            for name, clause in SERVER_SHAPES.items():
                conn.execute("TRUNCATE loop_probe")
                body = (
                    "DO $$ DECLARE kept bigint; BEGIN FOR i IN 1.." + str(SERVER_LOOP_ROWS) + " LOOP "
                    "INSERT INTO loop_probe (event_id) VALUES ('e' || i)" + clause + "; END LOOP; END $$"
                )
                t0 = time.perf_counter()
                conn.execute(body.encode())  # a constant statement: no input goes into it
                per_row[name].append((time.perf_counter() - t0) / SERVER_LOOP_ROWS * 1e6)
    return per_row


def _step_variants(conn: psycopg.Connection) -> dict[str, Callable[[psycopg.Cursor, Message], Any]]:
    """The outbox write of each whole-transaction variant, on the business INSERT's cursor."""
    outbox = Outbox(TABLE)
    plain = ceiling_sql.bind(PLAIN, TABLE)
    plain_on_conflict = ceiling_sql.bind(PLAIN + ON_CONFLICT, TABLE)
    plain_returning = ceiling_sql.bind(PLAIN + ON_CONFLICT + " RETURNING id", TABLE)
    ours = table_query("outbox_insert", TABLE)

    def reference(cur: psycopg.Cursor, message: Message) -> None:
        cur.execute(plain, _plain_params(message))

    def on_conflict(cur: psycopg.Cursor, message: Message) -> None:
        cur.execute(plain_on_conflict, _plain_params(message))

    def checks(cur: psycopg.Cursor, message: Message) -> None:
        row = _prepare_one(message, outbox.max_payload_bytes)
        cur.execute(plain, (row.event_id, row.topic, row.payload, row.payload_sha, row.headers))

    def count_and_result(cur: psycopg.Cursor, message: Message) -> EnqueueResult:
        cur.execute(plain, _plain_params(message))
        count_enqueued_one(TABLE, message.topic)
        return EnqueueResult.new(0, message.event_id or "")

    def enqueue_steps(statement: Any, returning: bool, ours_params: bool = False) -> Callable[..., EnqueueResult]:
        def write(cur: psycopg.Cursor, message: Message) -> EnqueueResult:
            row = _prepare_one(message, outbox.max_payload_bytes)
            if ours_params:
                cur.execute(statement, (*row[:6], None))
            else:
                cur.execute(statement, (row.event_id, row.topic, row.payload, row.payload_sha, row.headers))
            row_id = cur.fetchone()[0] if returning else cur.rowcount  # type: ignore[index]
            count_enqueued_one(TABLE, row.topic)
            return EnqueueResult.new(row_id, row.event_id)

        return write

    return {
        "plain INSERT, json.dumps and sha256 (the reference)": reference,
        "+ ON CONFLICT (the reference's Python)": on_conflict,
        "the reference with the enqueue's checks (_prepare_one) instead of json.dumps and sha256": checks,
        "the reference, then the enqueue's count and EnqueueResult": count_and_result,
        "checks, count, result and ON CONFLICT, no RETURNING": enqueue_steps(plain_on_conflict, False),
        "the same with RETURNING id": enqueue_steps(plain_returning, True),
        "the enqueue's own statement (7 parameters), checks, count, result, no insert_row": enqueue_steps(
            ours, True, ours_params=True
        ),
        "Outbox.enqueue(cur, message)": outbox.enqueue,
    }


def whole_transactions(url: str, rounds: int) -> dict[str, list[float]]:
    """µs per transaction of each variant, per round, in the bench's shuffled blocks."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(BUSINESS_DDL)
    per_round: dict[str, list[float]] = {}
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.commit()
        variants = _step_variants(conn)
        per_round = {name: [] for name in variants}

        def transaction(write: Callable[[psycopg.Cursor, Message], Any], message: Message) -> None:
            with conn.cursor() as cur:
                cur.execute(BUSINESS_INSERT, (Jsonb(message.payload),))
                write(cur, message)
            conn.commit()

        for round_index in range(rounds):
            work = {
                name: [_message(n, f"v{i}r{round_index}") for n in range(TRANSACTIONS)]
                for i, name in enumerate(variants)
            }
            for i, write in enumerate(variants.values()):
                for n in range(20):
                    transaction(write, _message(n, f"warm{i}r{round_index}"))
            totals = dict.fromkeys(variants, 0.0)
            order = random.Random(round_index)
            for start in range(0, TRANSACTIONS, BLOCK):
                for name in order.sample(list(variants), len(variants)):
                    write, messages = variants[name], work[name]
                    t0 = time.perf_counter()
                    for n in range(start, min(start + BLOCK, TRANSACTIONS)):
                        transaction(write, messages[n])
                    totals[name] += time.perf_counter() - t0
            for name, total in totals.items():
                per_round[name].append(total / TRANSACTIONS * 1e6)
            print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    return per_round


def _print_shapes(shapes: dict[str, float], calls: int) -> None:
    base = shapes["plain INSERT"]
    print(f"\n| statement (5 parameters), {calls:,} calls each, taking turns | µs a call (median) | over plain |")
    print("|---|---|---|")
    for name, value in shapes.items():
        print(f"| {name} | {value:.1f} | {value - base:+.1f} |")


def _print_server(loop: dict[str, list[float]]) -> None:
    print(f"\n| inside the server: a PL/pgSQL loop of {SERVER_LOOP_ROWS:,} INSERTs | µs a row, [min–max] over rounds |")
    print("|---|---|")
    for name, values in loop.items():
        print(f"| {name} | {statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}] |")


def _print_transactions(per_round: dict[str, list[float]]) -> None:
    reference = next(iter(per_round.values()))
    rounds = len(reference)
    print(
        f"\n| whole transaction ({rounds} rounds of {TRANSACTIONS:,} a variant, blocks of {BLOCK}) "
        f"| µs (median) | over the reference, median of the rounds' differences [min–max] |"
    )
    print("|---|---|---|")
    for name, values in per_round.items():
        differences = [value - base for value, base in zip(values, reference, strict=True)]
        spread = f"{statistics.median(differences):+.1f} [{min(differences):+.1f} to {max(differences):+.1f}]"
        print(f"| {name} | {statistics.median(values):.1f} | {'–' if values is reference else spread} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of the whole-transaction probe (default 12)")
    parser.add_argument("--calls", type=int, default=4_000, help="calls per statement shape (default 4,000)")
    args = parser.parse_args(argv)
    server = BenchServer()
    try:
        _, url = server.create_database("enqueue_breakdown")
        shapes = statement_shapes(url, args.calls)
        loop = server_loop(url, 3)
        per_round = whole_transactions(url, args.rounds)
        _print_shapes(shapes, args.calls)
        _print_server(loop)
        _print_transactions(per_round)
    finally:
        server.close()


if __name__ == "__main__":
    main()
