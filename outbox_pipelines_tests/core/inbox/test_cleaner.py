"""The cleaner empties each inbox of the entries received longer ago than its window, in bounded batches, and says
how many per inbox; the cleaner's gate counts them first; an inbox whose cleaner is off, or never created, is left
alone and named."""

import psycopg
import pytest

from outbox_pipelines import Inbox
from outbox_pipelines.core.inbox.cleaner import clean_inbox
from outbox_pipelines.core.operations.maintenance import clean_tables
from outbox_pipelines.core.operations.maintenance_due import clean_due
from outbox_pipelines.core.settings.inboxes import InboxSettings
from outbox_pipelines_tests.conftest import run_cli

DAY = 86400.0
INBOX = InboxSettings("billing_inbox", window_s=DAY)


@pytest.fixture
def entries(conn, inbox_table) -> None:
    """Five entries received two days ago (past a one-day window), two received an hour ago (inside it)."""
    conn.execute(
        "INSERT INTO billing_inbox (consumer, message_id, received_at) "
        "SELECT 'billing', 'old-' || n, now() - interval '2 days' FROM generate_series(1, 5) AS n"
    )
    conn.execute(
        "INSERT INTO billing_inbox (consumer, message_id, received_at) "
        "SELECT 'billing', 'new-' || n, now() - interval '1 hour' FROM generate_series(1, 2) AS n"
    )


def _left(conn) -> list[str]:
    return [row["message_id"] for row in conn.execute("SELECT message_id FROM billing_inbox ORDER BY 1")]


def test_entries_past_the_window_go_in_bounded_batches_and_the_rest_stay(db_url, conn, entries):
    said: list[str] = []
    with psycopg.connect(db_url, autocommit=True) as cleaning:
        assert clean_inbox(cleaning, INBOX, batch_size=2, progress=said.append) == 5
    assert said == [
        "billing_inbox: deleted 2 inbox entries",
        "billing_inbox: deleted 4 inbox entries",
        "billing_inbox: deleted 5 inbox entries",
    ]
    assert _left(conn) == ["new-1", "new-2"]


def test_a_message_redelivered_after_its_entry_went_is_handled_again(db_url, conn, entries):
    clean_tables(lambda: db_url, [], inboxes=[INBOX])
    with psycopg.connect(db_url) as consumer, consumer.transaction():
        assert Inbox("billing_inbox").receive(consumer, "old-1", consumer="billing")
        assert not Inbox("billing_inbox").receive(consumer, "new-1", consumer="billing")


def test_the_gate_counts_them_and_the_run_reports_them_per_inbox(db_url, conn, entries):
    due = clean_due(conn, [], dead_retention_s=DAY, audit_retention_s=DAY, inboxes=[INBOX])
    assert due == {"billing_inbox": "5 inbox entries past their window"}
    report = clean_tables(lambda: db_url, [], inboxes=[INBOX])
    assert report.inboxes == {"billing_inbox": 5}
    assert report.shared is None  # no outbox table chosen: the shared tables wait for a run that cleans one
    assert clean_due(conn, [], dead_retention_s=DAY, audit_retention_s=DAY, inboxes=[INBOX]) == {}


def test_a_cleaner_switched_off_or_an_inbox_never_created_is_left_alone(db_url, conn, entries):
    off = InboxSettings("billing_inbox", window_s=DAY, cleaner_enabled=False)
    never = InboxSettings("orders_inbox", window_s=DAY)
    assert clean_due(conn, [], dead_retention_s=DAY, audit_retention_s=DAY, inboxes=[off, never]) == {}
    report = clean_tables(lambda: db_url, [], inboxes=[off, never])
    assert report.inboxes == {}
    assert report.inboxes_skipped == {
        "billing_inbox": "cleaner disabled (OUTBOX_CLEANER_ENABLED / cleaner_enabled)",
        "orders_inbox": "not created yet: run 'outbox-pipelines db upgrade'",
    }
    assert len(_left(conn)) == 7
    assert clean_tables(lambda: db_url, [], inboxes=[off], force=True).inboxes == {"billing_inbox": 5}


def test_outbox_pipelines_clean_cleans_every_declared_inbox(cli_env, tmp_path, conn, entries):
    (tmp_path / "outbox.toml").write_text(
        '[tables.outbox_events]\ndestination = "paper"\n\n[inboxes.billing_inbox]\nwindow = "1d"\n'
    )
    env = {**cli_env, "OUTBOX_CONFIG": str(tmp_path / "outbox.toml")}
    done = run_cli(env, "clean")
    assert done.returncode == 0, done.stderr
    assert "billing_inbox: deleted 5 inbox entries older than 24 h (its window)" in done.stdout
    assert _left(conn) == ["new-1", "new-2"]


def test_clean_tells_an_inbox_declared_with_a_business_table_s_name_to_rename_it(cli_env, tmp_path, conn):
    """[inboxes.customers] where customers is the team's own table: not "run db upgrade" (which refuses it)."""
    conn.execute("CREATE TABLE customers (id int PRIMARY KEY)")
    (tmp_path / "outbox.toml").write_text(
        '[tables.outbox_events]\ndestination = "paper"\n\n[inboxes.customers]\n\n[inboxes.later_inbox]\n'
    )
    done = run_cli({**cli_env, "OUTBOX_CONFIG": str(tmp_path / "outbox.toml")}, "clean")
    assert done.returncode == 0, done.stderr
    assert "customers: a table that is not an inbox has this name: give its [inboxes.NAME] section another" in (
        done.stdout
    )
    assert "later_inbox: not created yet: run 'outbox-pipelines db upgrade'" in done.stdout


def test_dagsters_clean_job_cleans_every_declared_inbox_and_reports_it(db_url, tmp_path, conn, entries):
    import dagster as dg

    from outbox_pipelines.defs.resources import outbox_resources
    from outbox_pipelines_tests.defs.conftest import op_metadata, run_job

    config = tmp_path / "outbox.toml"
    config.write_text('[tables.outbox_events]\ndestination = "paper"\n\n[inboxes.billing_inbox]\nwindow = "1d"\n')
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_job("clean_job", outbox_resources(url=db_url, config_path=str(config)), instance)
    assert result.success
    assert op_metadata(result, "clean_op")["deleted_inbox_entries_by_inbox"] == {"billing_inbox": 5}
    assert _left(conn) == ["new-1", "new-2"]
