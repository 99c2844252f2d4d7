"""clean_tables, the one cleaner run of the CLI's ``clean`` and Dagster's ``clean_job``: its rules, in the core."""

from datetime import timedelta

import pytest

from outbox_pipelines.core.errors import RetentionTooShort
from outbox_pipelines.core.operations.maintenance import CLEANER_DISABLED, clean_tables
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.rows import make_sent

EVENTS, MEMORY = "outbox_events", "outbox_memory"


def _no_database() -> str:
    raise AssertionError("the run chose a database")


def _old_sent(conn, table: str, n: int = 2) -> None:
    enqueue_n(conn, table, n, prefix=f"{table}-")
    make_sent(conn, table, age=timedelta(days=30))


def test_a_retention_too_short_for_any_table_deletes_nothing_and_chooses_no_database(conn):
    _old_sent(conn, EVENTS)
    with pytest.raises(RetentionTooShort, match=f"^{MEMORY}: a retention of 2 h is shorter"):
        clean_tables(_no_database, [table_settings(EVENTS), table_settings(MEMORY)], retention_s=7200)
    with pytest.raises(RetentionTooShort, match=f"^{EVENTS}: "):  # a table's own retention is checked too
        clean_tables(_no_database, [table_settings(EVENTS, retention_s=60)])
    assert statuses(conn, EVENTS) == {"sent": 2}


def test_every_cleaner_off_skips_every_table_and_the_shared_ones_without_a_database():
    report = clean_tables(
        _no_database,
        [table_settings(EVENTS, cleaner_enabled=False), table_settings(MEMORY, cleaner_enabled=False, retention_s=1)],
    )
    assert [(t.table, t.skipped) for t in report.tables] == [(EVENTS, CLEANER_DISABLED), (MEMORY, CLEANER_DISABLED)]
    assert report.shared is None and report.deleted_sent_by_table == {}


def test_the_report_says_per_table_what_went_with_which_retention_and_the_shared_tables_once(db_url, conn):
    _old_sent(conn, EVENTS)
    _old_sent(conn, MEMORY)
    urls = []
    report = clean_tables(
        lambda: urls.append(db_url) or db_url, [table_settings(EVENTS), table_settings(MEMORY, cleaner_enabled=False)]
    )
    assert urls == [db_url]  # chosen once
    assert [(t.table, t.deleted_sent, t.retention_s, t.skipped) for t in report.tables] == [
        (EVENTS, 2, 168 * 3600.0, None),
        (MEMORY, 0, 168 * 3600.0, CLEANER_DISABLED),
    ]
    assert report.shared is not None and report.deleted_sent_total == 2
    assert statuses(conn, EVENTS) == {} and statuses(conn, MEMORY) == {"sent": 2}
