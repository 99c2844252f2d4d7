"""The vacuum check (core/oncall/database_health.py): a snapshot held open while an outbox table churns makes it
fire with the holder's pid, application and the statement that ends it, never the holder's query text; once the
holder is gone and the table vacuumed it clears. The sweep tells it once for the database and resolves it once."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg

from outbox_pipelines.core.oncall.database_health import (
    CONDITION_KEY,
    DatabaseHealth,
    Holder,
    TableVacuum,
    vacuum_verdict,
    vacuum_verdicts,
)
from outbox_pipelines.core.oncall.sweep import sweep
from outbox_pipelines.core.settings import CheckThresholds, Settings, load_settings
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import db_now, enqueue_n
from outbox_pipelines_tests.rows import make_sent

EVENTS = "outbox_events"
SECRET = "hunter2-in-a-literal"


def _settings(**limits: object) -> Settings:
    """The shipped settings, outbox_events' vacuum thresholds small enough for a test's few hundred rows."""
    settings = load_settings(env={}, path=None)
    events = settings.tables[EVENTS]
    checks = replace(events.checks, **limits)  # type: ignore[arg-type]  # CheckThresholds fields by name
    return replace(settings, tables={**settings.tables, EVENTS: replace(events, checks=checks)})


@contextmanager
def held_snapshot(db_url: str) -> Iterator[int]:
    """A report's session: REPEATABLE READ, its snapshot taken by a query carrying a secret, left open."""
    holder = psycopg.connect(db_url, application_name="monthly-report")
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        holder.execute(f"SELECT count(*), '{SECRET}' FROM {EVENTS}")
        yield holder.info.backend_pid
    finally:
        holder.rollback()
        holder.close()


def _churn(conn, n: int = 400) -> None:
    """n messages enqueued, delivered (their claim-and-settle row versions left dead) and vacuumed as far as
    the database lets vacuum go."""
    enqueue_n(conn, EVENTS, n, prefix=f"churn-{db_now(conn).timestamp()}-")
    make_sent(conn, EVENTS)
    conn.execute(f"UPDATE {EVENTS} SET updated_at = updated_at")  # another version of every row
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    conn.execute(f"VACUUM {EVENTS}")


def _verdict(db_url: str, settings: Settings, *, later_s: float = 0.0):
    with psycopg.connect(db_url, autocommit=True) as reader:
        now = reader.execute("SELECT now()").fetchone()[0] + timedelta(seconds=later_s)
        return vacuum_verdicts(reader, settings, [EVENTS], now=now)[EVENTS]


def test_a_held_snapshot_fires_the_vacuum_check_with_what_to_do_and_ending_it_clears_it(db_url, conn):
    settings = _settings(dead_tuples_warn=100, dead_tuples_ratio_warn=100.0)  # the holder's rule alone
    with held_snapshot(db_url) as pid:
        _churn(conn)
        error = _verdict(db_url, settings, later_s=2 * 3600)  # the snapshot two hours old: past vacuum_held_error
        assert error.severity == "error" and not error.passed
        text = error.description
        assert text.startswith(f"{EVENTS}: a transaction open for 2 h (pid {pid}, application 'monthly-report'")
        assert "holds vacuum back" in text and f"SELECT pg_terminate_backend({pid})" in text
        assert error.metadata["dead_tuples"] >= 400 and error.metadata["holder_pid"] == pid
        assert SECRET not in text and SECRET not in str(error.metadata)
        assert _verdict(db_url, settings, later_s=20 * 60).severity == "warn"  # past vacuum_held_warn only
        assert _verdict(db_url, settings).severity == "ok"  # held for a moment: nothing to say yet
        assert _verdict(db_url, _settings(dead_tuples_warn=100_000), later_s=2 * 3600).severity == "ok"
    conn.execute(f"VACUUM {EVENTS}")  # what autovacuum does next, once nothing holds it back
    cleared = _verdict(db_url, settings, later_s=2 * 3600)
    assert cleared.severity == "ok" and cleared.metadata["dead_tuples"] == 0
    assert cleared.metadata["live_rows"] == 400 and cleared.metadata["holder"] is None
    assert cleared.description.startswith(f"{EVENTS}: 0 dead tuples, 0.0 % of its 400 live rows;")


def test_dead_tuples_piling_up_with_nothing_holding_vacuum_back_say_autovacuum_falls_behind(db_url, conn):
    enqueue_n(conn, EVENTS, 200)
    conn.execute("ALTER TABLE outbox_events SET (autovacuum_enabled = off)")  # autovacuum kept away
    conn.execute(f"DELETE FROM {EVENTS} WHERE id % 2 = 0")
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    verdict = _verdict(db_url, _settings(dead_tuples_warn=50))
    assert verdict.severity == "warn"
    assert verdict.description.startswith(f"{EVENTS}: vacuum is falling behind: 100 dead tuples, 100.0 % of its")
    assert f"Run VACUUM (VERBOSE) {EVENTS}" in verdict.description


def test_the_sweep_tells_a_held_vacuum_once_for_the_database_and_resolves_it_once(db_url, conn, http_sink):
    settings = _settings(dead_tuples_warn=100, dead_tuples_ratio_warn=100.0)

    def told(later_s: float) -> list[str]:
        now = db_now(conn) + timedelta(seconds=later_s)
        report = sweep(db_url, settings, now=now, webhook_url=http_sink.url, repeat_s=1800)
        assert [v.name for v in report.verdicts[EVENTS]][-1] == "vacuum"
        return [f"{a['status']} {a['severity']}" for a in report.alerts if a["alert_key"] == CONDITION_KEY]

    with held_snapshot(db_url) as pid:
        _churn(conn)
        assert told(2 * 3600) == ["firing error"]
        assert told(2 * 3600 + 15) == []  # still held: nothing new to say
        [body] = [r.body for r in http_sink.received if r.body["alert_key"] == CONDITION_KEY]
        assert body["table"] == EVENTS and body["check"] == "vacuum" and body["kind"] == "database"
        assert f"pg_terminate_backend({pid})" in body["text"] and SECRET not in body["text"]
    conn.execute(f"VACUUM {EVENTS}")
    assert told(2 * 3600 + 30) == ["resolved error"]
    assert told(2 * 3600 + 45) == []


def test_the_shipped_vacuum_thresholds():
    """10 min / 1 h held, 100,000 dead tuples, 0.2 dead per live row: documented in docs/how-to/retention.md."""
    limits = CheckThresholds()
    assert (limits.vacuum_held_warn_s, limits.vacuum_held_error_s) == (600.0, 3600.0)
    assert (limits.dead_tuples_warn, limits.dead_tuples_ratio_warn) == (100_000, 0.2)


def test_status_prints_each_tables_vacuum_verdict(cli_env, conn):
    enqueue_n(conn, EVENTS, 3)
    result = run_cli(cli_env, "status", "--table", EVENTS)
    assert result.returncode == 0, result.stderr
    assert "\nvacuum (dead tuples, size, what holds vacuum back):\n  OK    outbox_events: " in result.stdout


def _health(holder: Holder | None, dead: int, live: int = 1_000_000) -> DatabaseHealth:
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    table = TableVacuum(EVENTS, live, dead, 2**30, 2**28, now - timedelta(minutes=3))
    return DatabaseHealth(now, {EVENTS: table}, holder)


SLOT = Holder("replication slot", None, None, "inactive", "standby_b", 2_500_000, None)
UNSEEN = Holder("transaction", 4321, "etl", None, None, 900_000, None)  # another role's, not readable
YOUNG = Holder("transaction", 99, "api", "active", None, 12, 0.4)


def test_a_holder_of_unknown_age_is_blamed_only_once_dead_tuples_pile_up():
    limits = CheckThresholds()
    slot = vacuum_verdict(_health(SLOT, 300_000), EVENTS, limits)
    assert slot.severity == "warn"
    assert slot.description.startswith(
        f"{EVENTS}: replication slot 'standby_b' (inactive, 2.5M transactions behind) holds vacuum back: "
        "300,000 dead tuples, 30.0 % of its 1.0M live rows (1.2 GiB with its indexes)"
    )
    assert "SELECT pg_drop_replication_slot('standby_b')" in slot.description
    assert vacuum_verdict(_health(UNSEEN, 150_000), EVENTS, limits).severity == "ok"  # 15 %: below the ratio
    unseen = vacuum_verdict(_health(UNSEEN, 250_000), EVENTS, limits)
    assert unseen.severity == "warn" and "a transaction (pid 4321, application 'etl')" in unseen.description
    young = vacuum_verdict(_health(YOUNG, 250_000), EVENTS, limits)  # a 0.4 s transaction is not the cause
    assert young.severity == "warn" and "vacuum is falling behind: 250,000 dead tuples" in young.description
    assert "last vacuumed 3 min ago; nothing has held it back for long" in young.description
