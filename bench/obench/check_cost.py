"""checks: what one evaluation of a table's health checks costs with many sent rows kept.

The on-call sensor evaluates every table's checks every 15 s, so an evaluation
must not grow with the table. A table keeps ``flat_sent_rows`` sent rows (a
week of retention at a steady rate, inserted with generate_series), 10,000
pending messages (half of them retrying in backoff) and 100 dead ones. Ours:
``read_status`` + ``evaluate_checks``, the sensor's work per table. Reference:
what a person would write first, one ``SELECT status, count(*) ... GROUP BY
status`` plus the percentile of created → published over the last hour. Each
figure is the median of 20 evaluations after two warm-ups.
"""

import statistics
import time

import psycopg

from obench.common import Figure, ScenarioResult, Sizes, Target, log

TABLE = "outbox_orders"
EVALUATIONS = 20

NAIVE = """
SELECT status, count(*) FROM outbox_orders GROUP BY status;
"""
NAIVE_LAG = """
SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at))
FROM outbox_orders WHERE status = 'sent' AND published_at >= now() - interval '1 hour'
"""


def _fill(url: str, sent: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_orders (event_id, topic, payload, payload_sha, status, attempts, created_at,"
            " published_at, updated_at)"
            " SELECT 's' || g, 'order.submit', '{\"n\": 1}', 'sha256:x', 'sent', 1,"
            "        now() - make_interval(secs => g * 0.6) - interval '2 seconds',"
            "        now() - make_interval(secs => g * 0.6), now() FROM generate_series(1, %s) AS g",
            (sent,),
        )
        conn.execute(
            "INSERT INTO outbox_orders (event_id, topic, payload, payload_sha, status, attempts, available_at)"
            " SELECT 'p' || g, 'order.submit', '{\"n\": 1}', 'sha256:x', 'pending', g % 2,"
            "        now() + make_interval(secs => (g % 2) * 60) FROM generate_series(1, 10000) AS g"
        )
        conn.execute(
            "INSERT INTO outbox_orders (event_id, topic, payload, payload_sha, status, attempts, last_error_code)"
            " SELECT 'd' || g, 'order.submit', '{\"n\": 1}', 'sha256:x', 'dead', 8, 'BROKER_5XX'"
            " FROM generate_series(1, 100) AS g"
        )
        conn.execute("VACUUM ANALYZE outbox_orders")


def _time_ms(fn, runs: int) -> float:
    for _ in range(2):
        fn()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def run(url: str, sizes: Sizes, runs: int) -> ScenarioResult:
    from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
    from outbox_pipelines.core.settings import CheckThresholds
    from outbox_pipelines.core.storage.table import OutboxTable

    log(f"checks: filling {TABLE} with {sizes.flat_sent_rows:,} sent rows, 10,000 pending, 100 dead")
    _fill(url, sizes.flat_sent_rows)
    ours, naive = [], []
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        table = OutboxTable(conn, TABLE)

        def evaluate() -> None:
            evaluate_checks(read_status(table), CheckThresholds())

        def first_try() -> None:
            conn.execute(NAIVE).fetchall()
            conn.execute(NAIVE_LAG).fetchall()

        for run_no in range(runs):
            ours.append(_time_ms(evaluate, EVALUATIONS))
            naive.append(_time_ms(first_try, EVALUATIONS))
            log(f"checks run {run_no + 1}: ours {ours[-1]:.1f} ms, GROUP BY status + lag {naive[-1]:.1f} ms")
    return ScenarioResult(
        figures=[
            Figure(
                "checks",
                f"one evaluation of a table's 5 checks, {sizes.flat_sent_rows:,} sent rows kept",
                "ms",
                ours,
                naive,
                "SELECT status, count(*) GROUP BY status + lag percentile",
                Target("<= 50 ms per table (the sensor evaluates every 15 s)", value_max=50.0),
                note="median of 20 evaluations per run",
            )
        ]
    )
