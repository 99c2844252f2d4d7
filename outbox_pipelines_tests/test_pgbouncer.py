"""Behind PgBouncer in transaction pooling mode (Debian's pgbouncer, started here): enqueue joins the
caller's transaction, the relay drains (its statements unprepared), polls when LISTEN cannot pass the
pooler and says so once, wakes at once on a direct session, and a single-active relay refuses to run
without one (docs/deploy.md, "Behind PgBouncer")."""

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.storage import pooler
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.pgbouncer import PgBouncer
from outbox_pipelines_tests.processes import start_relay, stop_and_read, wait_until
from outbox_pipelines_tests.scratch import DEMO_PARTS

TABLE = "outbox_events"  # shipped as single-active, with in-process handlers of org.changed
POLLING = "LISTEN/NOTIFY cannot pass a transaction pooler"
DROPPED_OPTIONS = "refuses session settings at connect"


@pytest.fixture
def bouncer(db_url: str) -> Iterator[PgBouncer]:
    pgbouncer = PgBouncer(db_url, pool_size=2)
    yield pgbouncer
    pgbouncer.stop()


@pytest.fixture
def competing_config(tmp_path: Path) -> Path:
    path = tmp_path / "outbox.toml"
    path.write_text(f'{DEMO_PARTS}[tables.{TABLE}]\nmode = "competing"\n')
    return path


def pooled_env(cli_env: dict[str, str], bouncer: PgBouncer, **extra: str) -> dict[str, str]:
    return {**cli_env, "OUTBOX_DATABASE_URL": bouncer.url, **extra}


def org_changed(n: int, prefix: str) -> list[Message]:
    return [Message(topic="org.changed", payload={"org_id": i}, event_id=f"{prefix}-{i}") for i in range(n)]


def wait_until_idle(conn: psycopg.Connection, relay: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    """Until the relay's session sits idle after asking when the next row is due (nothing to claim)."""
    wait_until(
        lambda: conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle' AND query LIKE '%%AS next_due_in_s%%'"
        ).fetchone()["n"],
        timeout_s,
        "the relay to go idle",
        interval_s=0.05,
        process=relay,
    )


def wait_for_sent(conn: psycopg.Connection, n: int, timeout_s: float) -> float:
    """Seconds until ``n`` rows of the table are sent (AssertionError after ``timeout_s``)."""
    started = time.monotonic()
    while statuses(conn, TABLE).get("sent", 0) < n:
        assert time.monotonic() - started < timeout_s, f"not sent within {timeout_s}s: {statuses(conn, TABLE)}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_the_pooler_is_told_apart_from_a_direct_connection(bouncer, db_url):
    with psycopg.connect(bouncer.url, autocommit=True, row_factory=dict_row) as through_pooler:
        assert pooler.behind_pooler(through_pooler)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as direct:
        assert not pooler.behind_pooler(direct)


def test_enqueue_joins_the_callers_transaction_through_pgbouncer(bouncer, conn):
    conn.execute("CREATE TABLE orgs (id int PRIMARY KEY, name text NOT NULL)")
    outbox = Outbox(TABLE)
    # psycopg's advice behind a transaction pooler: no prepared statements (PgBouncer 1.18 cannot carry them).
    with psycopg.connect(bouncer.url, prepare_threshold=None) as app:
        for i in range(12):  # more than psycopg's prepare threshold of 5
            with app.transaction():
                app.execute("INSERT INTO orgs VALUES (%s, %s)", (i, f"org {i}"))
                outbox.enqueue(app, Message(topic="org.changed", payload={"org_id": i}, event_id=f"one-{i}"))
        with pytest.raises(RuntimeError), app.transaction():
            app.execute("INSERT INTO orgs VALUES (99, 'rolled back')")
            outbox.enqueue(app, Message(topic="org.changed", payload={"org_id": 99}, event_id="one-99"))
            raise RuntimeError("the business transaction fails")
        with app.transaction():
            results = outbox.enqueue_many(app, [*org_changed(50, "many"), *org_changed(2, "many")])
        again = outbox.enqueue(app, Message(topic="org.changed", payload={"org_id": 3}, event_id="one-3"))
    assert [r.duplicate for r in results[-2:]] == [True, True] and results[-1].same_payload
    assert again.duplicate and again.same_payload
    assert conn.execute("SELECT count(*) AS n FROM orgs").fetchone()["n"] == 12
    assert statuses(conn, TABLE) == {"pending": 12 + 50}
    assert conn.execute(f"SELECT count(*) AS n FROM {TABLE} WHERE event_id = 'one-99'").fetchone()["n"] == 0


def test_competing_relays_drain_through_pgbouncer_and_each_says_once_that_it_polls(
    db_url, cli_env, conn, competing_config
):
    # One server connection for both relays: a statement one prepared would be missing or taken for the other.
    bouncer = PgBouncer(db_url, pool_size=1)
    try:
        Outbox(TABLE).enqueue_many(conn, org_changed(600, "drain"), outside_transaction=True)
        env = pooled_env(cli_env, bouncer, OUTBOX_CONFIG=str(competing_config))
        relays = [start_relay(env, TABLE, "--once", "--batch-size", "10") for _ in range(2)]
        outcomes = [(relay.wait(timeout=120), relay.communicate()[1]) for relay in relays]
    finally:
        bouncer.stop()
    for code, stderr in outcomes:
        assert code == 0, stderr
        assert stderr.count(POLLING) == 1, stderr
        # The relay's session settings cannot pass PgBouncer 1.18: dropped, said once, and how to set them instead.
        assert stderr.count(DROPPED_OPTIONS) == 1 and "ALTER ROLE" in stderr
    assert statuses(conn, TABLE) == {"sent": 600}  # 60 claims and settles, none tripped on a prepared statement


def test_an_idle_relay_behind_pgbouncer_picks_up_new_messages_by_polling(bouncer, cli_env, conn, competing_config):
    relay = start_relay(
        pooled_env(cli_env, bouncer, OUTBOX_CONFIG=str(competing_config), OUTBOX_IDLE_SLEEP_MS="300"),
        TABLE,
        "--max-seconds",
        "60",
    )
    try:
        wait_until_idle(conn, relay)
        Outbox(TABLE).enqueue_many(conn, org_changed(3, "later"), outside_transaction=True)
        wait_for_sent(conn, 3, timeout_s=15)
    finally:
        code, _, stderr = stop_and_read(relay)
    assert code == 0, stderr
    assert stderr.count(POLLING) == 1


def test_a_direct_session_wakes_the_relay_at_once_and_carries_the_single_active_lock(bouncer, cli_env, conn, db_url):
    # Polling would take 60 s here: delivery within seconds is the NOTIFY on the direct session.
    relay = start_relay(
        pooled_env(cli_env, bouncer, OUTBOX_DIRECT_DATABASE_URL=db_url, OUTBOX_IDLE_SLEEP_MS="60000"),
        TABLE,
        "--max-seconds",
        "90",
    )
    try:
        wait_until_idle(conn, relay)
        Outbox(TABLE).enqueue(
            conn, Message(topic="org.changed", payload={"org_id": 1}, event_id="wake-1"), outside_transaction=True
        )
        assert wait_for_sent(conn, 1, timeout_s=10) < 10
        lock_holders = conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchone()["n"]
        assert lock_holders == 1  # the single-active lock, on the direct session
    finally:
        code, _, stderr = stop_and_read(relay)
    assert code == 0, stderr
    assert POLLING not in stderr


def test_a_single_active_relay_behind_pgbouncer_without_a_direct_session_refuses_and_says_what_to_set(
    bouncer, cli_env, conn
):
    Outbox(TABLE).enqueue(
        conn, Message(topic="org.changed", payload={"org_id": 1}, event_id="refused-1"), outside_transaction=True
    )
    relay = run_cli(pooled_env(cli_env, bouncer), "relay", "--table", TABLE, "--once")
    assert relay.returncode == 2, (relay.returncode, relay.stdout, relay.stderr)
    assert "single-active" in relay.stderr and pooler.DIRECT_DATABASE_URL_ENV in relay.stderr
    assert "Traceback" not in relay.stderr
    assert statuses(conn, TABLE) == {"pending": 1}


def test_db_upgrade_through_the_pooler_is_refused_unless_a_direct_url_is_given(cli_env, bouncer, db_url):
    """Through a transaction pooler the upgrade's session lock would be left to the next client of that server
    connection: refused, nothing applied; with OUTBOX_DIRECT_DATABASE_URL it runs on the direct connection."""
    refused = run_cli(pooled_env(cli_env, bouncer), "db", "upgrade")
    assert refused.returncode == 1
    assert "db upgrade goes through a connection pooler" in refused.stderr
    assert "OUTBOX_DIRECT_DATABASE_URL" in refused.stderr and "Nothing was applied" in refused.stderr
    direct = run_cli(pooled_env(cli_env, bouncer, OUTBOX_DIRECT_DATABASE_URL=db_url), "db", "upgrade")
    assert direct.returncode == 0, direct.stderr
    assert "database is up to date" in direct.stdout
