"""Tables that stay small (docs/how-to/retention.md): the stated retention of sent rows, dead rows, the audit
and the order part's ledger; dead rows and old audit rows deleted by the cleaner in short batches; the
autovacuum settings ``db upgrade`` gives the outbox tables and the audit."""

from datetime import timedelta

import psycopg
import pytest

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.operations.maintenance import clean_tables, delete_old_audit
from outbox_pipelines.core.operations.upgrade import plan_project, upgrade_project
from outbox_pipelines.core.settings import GlobalSettings, load_settings
from outbox_pipelines.core.storage import autovacuum
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import SharedTables
from outbox_pipelines.orders.ledger import LEDGER_TTL_S
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import audit_codes, db_now, enqueue_n, statuses
from outbox_pipelines_tests.rows import make_dead

EVENTS = "outbox_events"
DAY = 86400.0


def _options(conn, table: str) -> dict[str, str]:
    row = conn.execute("SELECT coalesce(reloptions, '{}') AS o FROM pg_class WHERE relname = %s", (table,)).fetchone()
    return dict(option.split("=", 1) for option in row["o"])


def test_the_stated_retentions_and_their_variables():
    unset = GlobalSettings.from_env({})
    assert unset.cleaner_retention_s == 168 * 3600  # sent rows: a week, the dedup horizon's floor is 1 h
    assert unset.cleaner_dead_retention_s == 30 * DAY  # dead rows: a month for a person to look
    assert unset.audit_retention_s == 30 * DAY  # the audit: as long as the dead rows it explains
    assert LEDGER_TTL_S == 48 * 3600  # the order part's ledger: each row expires 48 h after its order
    given = GlobalSettings.from_env(
        {"OUTBOX_CLEANER_DEAD_RETENTION": "90d", "OUTBOX_AUDIT_RETENTION": "7d", "OUTBOX_AUTOVACUUM": "off"}
    )
    assert (given.cleaner_dead_retention_s, given.audit_retention_s, given.autovacuum) == (90 * DAY, 7 * DAY, "off")
    with pytest.raises(ConfigError, match="OUTBOX_AUDIT_RETENTION: cannot read duration 'a month'"):
        GlobalSettings.from_env({"OUTBOX_AUDIT_RETENTION": "a month"})


def test_the_cleaner_deletes_dead_rows_past_their_retention_but_never_a_parked_head(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 5)
    t0 = db_now(conn)
    make_dead(conn, EVENTS, ids[:4], at=t0 - timedelta(days=31))
    make_dead(conn, EVENTS, ids[4], at=t0 - timedelta(days=29))  # dead 29 days: kept
    # ids[1] parks its ordering key (its key's later messages wait for a person); ids[2]'s key was passed over
    conn.execute("UPDATE outbox_events SET ordering_key = 'order-1' WHERE id = %s", (ids[1],))
    conn.execute(
        "UPDATE outbox_events SET ordering_key = 'order-2', ordering_skipped_at = now() WHERE id = %s", (ids[2],)
    )
    report = clean_tables(lambda: db_url, [table_settings(EVENTS)])
    assert report.deleted_dead_by_table == {EVENTS: 3}
    kept = [r["id"] for r in conn.execute("SELECT id FROM outbox_events ORDER BY id")]
    assert kept == [ids[1], ids[4]]
    assert audit_codes(conn, EVENTS)[-1] == "outbox_clean_dead"
    detail = conn.execute("SELECT detail FROM outbox_audit WHERE code = 'outbox_clean_dead'").fetchone()["detail"]
    assert detail == f"deleted 3 dead rows, ids {ids[0]}..{ids[3]}"
    # a run given its own dead retention (the CLI's environment, clean_job's dead_retention)
    assert clean_tables(lambda: db_url, [table_settings(EVENTS)], dead_retention_s=DAY).deleted_dead_by_table == {
        EVENTS: 1
    }
    assert statuses(conn, EVENTS) == {"dead": 1}  # the parked head, still there for a person


def test_old_audit_rows_go_by_default_in_batches_walking_the_ids_and_stop_at_the_first_new_batch(db_url, conn):
    # a cleaner run without an audit retention keeps OUTBOX_AUDIT_RETENTION's 30 days
    conn.execute(
        "INSERT INTO outbox_audit (outbox_table, code, worker, created_at) VALUES "
        "('outbox_events', 'outbox_claim', 'w', now() - interval '31 days'), "
        "('outbox_events', 'outbox_claim', 'w', now() - interval '29 days')"
    )
    enqueue_n(conn, EVENTS, 1)
    report = clean_tables(lambda: db_url, [table_settings(EVENTS)])
    assert report.shared is not None and report.shared.deleted_audit == 1
    conn.execute("DELETE FROM outbox_audit")
    conn.execute(
        "INSERT INTO outbox_audit (outbox_table, code, worker, created_at) "
        "SELECT 'outbox_events', 'outbox_claim', 'w', now() - interval '40 days' FROM generate_series(1, 12000)"
    )
    conn.execute(
        "INSERT INTO outbox_audit (outbox_table, code, worker) "
        "SELECT 'outbox_events', 'outbox_claim', 'w' FROM generate_series(1, 6000)"
    )
    batches: list[str] = []
    with connect(db_url) as cleaner:
        deleted = delete_old_audit(SharedTables(cleaner), 30 * DAY, batch_size=5000, progress=batches.append)
    assert deleted == 12000
    # 5,000 + 5,000 + 2,000 (with 3,000 new rows); the next batch, all new, deletes nothing and ends the walk
    assert batches == [f"outbox_audit: deleted {n} rows" for n in (5000, 10000, 12000)]
    assert conn.execute("SELECT count(*) AS n FROM outbox_audit").fetchone()["n"] == 6000


def test_an_audit_batch_never_waits_for_a_writer_of_the_audit_nor_a_writer_for_it(db_url, conn):
    conn.execute(
        "INSERT INTO outbox_audit (outbox_table, code, worker, created_at) "
        "SELECT 'outbox_events', 'outbox_claim', 'w', now() - interval '40 days' FROM generate_series(1, 3000)"
    )
    with psycopg.connect(db_url) as writer:  # a relay's settle: its audit row written, not committed yet
        writer.execute("INSERT INTO outbox_audit (outbox_table, code, worker) VALUES ('outbox_events', 'x', 'relay')")
        with connect(db_url) as cleaner:
            cleaner.execute("SET lock_timeout = '1s'")  # a wait would fail the test instead of hanging it
            assert delete_old_audit(SharedTables(cleaner), 30 * DAY, batch_size=1000) == 3000
        writer.commit()
    assert conn.execute("SELECT count(*) AS n FROM outbox_audit").fetchone()["n"] == 1


def test_db_upgrade_gives_the_outbox_tables_and_the_audit_their_autovacuum_settings_once(db_url, conn):
    settings = load_settings(env={}, path=None)
    planned = plan_project(db_url, settings).storage  # what db upgrade --dry-run and --sql show
    assert "ALTER TABLE \"outbox_audit\" SET (autovacuum_vacuum_scale_factor = '0.02'" in planned[-1]
    with psycopg.connect(db_url) as writer:  # a producer's transaction open on the table: ALTER ... SET goes by
        writer.execute("INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES ('w', 't', '{}', 'x')")
        report = upgrade_project(db_url, settings)
        writer.commit()
    assert _options(conn, EVENTS) == autovacuum.OUTBOX_TABLE_DEFAULTS
    assert _options(conn, "outbox_audit") == autovacuum.AUDIT_DEFAULTS
    assert report.autovacuum is not None and set(report.autovacuum.applied) == {*report.tables, "outbox_audit"}
    again = upgrade_project(db_url, settings)
    assert again.autovacuum is not None and again.autovacuum.applied == {}  # already so: no ALTER, no lock
    assert plan_project(db_url, settings).storage == []


def test_outbox_autovacuum_overrides_or_leaves_the_settings_alone(db_url, conn):
    tables = [EVENTS, "outbox_audit"]
    assert autovacuum.apply(db_url, tables, "off").applied == {}
    assert _options(conn, EVENTS) == {}
    autovacuum.apply(db_url, tables, "autovacuum_vacuum_scale_factor=0.05, autovacuum_vacuum_cost_delay=1")
    assert _options(conn, EVENTS) == {
        **autovacuum.OUTBOX_TABLE_DEFAULTS,
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_vacuum_cost_delay": "1",
    }
    assert _options(conn, "outbox_audit")["autovacuum_vacuum_scale_factor"] == "0.05"
    assert autovacuum.plan_sql(db_url, tables, "default") == [
        "ALTER TABLE \"outbox_events\" SET (autovacuum_vacuum_scale_factor = '0.01');",
        "ALTER TABLE \"outbox_audit\" SET (autovacuum_vacuum_scale_factor = '0.02');",
    ]
    for bad in ("autovacuum_vacuum_scale_factor", "work_mem=1GB", "fillfactor=70; DROP TABLE x"):
        with pytest.raises(ConfigError, match="OUTBOX_AUTOVACUUM="):
            autovacuum.parse(bad)


def test_a_table_held_by_a_vacuum_is_left_for_the_next_upgrade(db_url, conn, monkeypatch):
    monkeypatch.setattr(autovacuum, "LOCK_TIMEOUT_S", 0.2)
    with psycopg.connect(db_url) as vacuum_like:  # what VACUUM holds: SHARE UPDATE EXCLUSIVE
        vacuum_like.execute("LOCK TABLE outbox_events IN SHARE UPDATE EXCLUSIVE MODE")
        report = autovacuum.apply(db_url, [EVENTS, "outbox_audit"], "default")
        vacuum_like.rollback()
    assert list(report.skipped) == [EVENTS] and "the next db upgrade" in report.skipped[EVENTS]
    assert list(report.applied) == ["outbox_audit"]


def test_db_upgrade_says_which_tables_got_their_autovacuum_settings(cli_env, conn):
    first = run_cli(cli_env, "db", "upgrade")
    assert first.returncode == 0, first.stderr
    assert "autovacuum settings (OUTBOX_AUTOVACUUM) set on: " in first.stdout and "outbox_audit" in first.stdout
    assert _options(conn, "outbox_audit") == autovacuum.AUDIT_DEFAULTS
    again = run_cli(cli_env, "db", "upgrade")
    assert again.returncode == 0 and "autovacuum settings" not in again.stdout  # already so: said once
