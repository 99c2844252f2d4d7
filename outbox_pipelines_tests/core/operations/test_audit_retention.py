"""The audit of a message still dead outlives every audit retention (docs/how-to/retention.md).

An on-call engineer's ``clean --audit-retention 1s`` deleted the whole audit, the stories of the dead messages it
was about to replay among it. The cleaner now keeps the rows of every message still dead, in every outbox table,
and deletes the rest as asked; the hourly schedule's due check agrees with it.
"""

from datetime import timedelta

from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.operations.maintenance import clean_shared
from outbox_pipelines.core.operations.maintenance_due import AUDIT, clean_due
from outbox_pipelines.testing import relay_once
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, db_now, enqueue_n, statuses

DEAD_FIRST = 2  # the lowest ids die: their rows open the audit, so a walk that stopped at a batch deleting
# nothing would stop there


def _relay_with_dead(db_url, conn, table: str) -> list[int]:
    enqueue_n(conn, table, 12)
    first = conn.execute(f"SELECT min(id) AS id FROM {table}").fetchone()["id"]
    dying = set(range(first, first + DEAD_FIRST))
    destination = ScriptedDestination(lambda m: Outcome.dead("BAD_REQUEST") if m.id in dying else Outcome.sent())
    relay_once(db_url, table, destination, settings=table_settings(table))
    assert statuses(conn, table) == {"sent": 12 - DEAD_FIRST, "dead": DEAD_FIRST}
    return sorted(dying)


def _audit_of(conn) -> dict[tuple[str, int | None], int]:
    rows = conn.execute("SELECT outbox_table, message_id, count(*) AS n FROM outbox_audit GROUP BY 1, 2").fetchall()
    return {(r["outbox_table"], r["message_id"]): r["n"] for r in rows}


def test_any_audit_retention_keeps_the_rows_of_messages_still_dead_and_deletes_the_rest(db_url, conn):
    dead = {("outbox_events", i) for i in _relay_with_dead(db_url, conn, "outbox_events")}
    dead |= {("outbox_memory", i) for i in _relay_with_dead(db_url, conn, "outbox_memory")}
    before = _audit_of(conn)
    assert all(before.get(key) for key in dead) and len(before) > len(dead), "each death is audited, and more"
    later = db_now(conn) + timedelta(days=1)
    tables = [table_settings("outbox_events")]
    assert AUDIT in clean_due(conn, tables, dead_retention_s=30 * 86400, audit_retention_s=1, now=later)

    report = clean_shared(db_url, audit_retention_s=1, batch_size=2, now=later)

    after = _audit_of(conn)
    assert after == {key: n for key, n in before.items() if key in dead}
    assert report.deleted_audit == sum(before.values()) - sum(after.values())
    # What is left is old but kept: nothing is due, so the hourly schedule launches no run for it.
    assert AUDIT not in clean_due(conn, tables, dead_retention_s=30 * 86400, audit_retention_s=1, now=later)


def test_clean_audit_retention_1s_from_the_cli_keeps_the_dead_messages_stories(db_url, conn, cli_env):
    dead = _relay_with_dead(db_url, conn, "outbox_events")
    conn.execute("UPDATE outbox_audit SET created_at = created_at - interval '1 hour'")  # older than the 1 s given
    result = run_cli(cli_env, "clean", "--table", "outbox_events", "--audit-retention", "1s")
    assert result.returncode == 0, result.stderr
    kept = _audit_of(conn)
    assert set(kept) == {("outbox_events", i) for i in dead}
    codes = {r["code"] for r in conn.execute("SELECT code FROM outbox_audit WHERE message_id = %s", (dead[0],))}
    assert "outbox_flush_dead" in codes, codes
