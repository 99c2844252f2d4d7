"""`db upgrade` beside a live application: a migration that meets a long transaction never holds the application's
writes for longer than its lock timeout; it waits its turn, or gives up naming who held it. An unsupported server is
refused before anything is applied."""

import shutil
import threading
import time
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage import migrate
from outbox_pipelines.core.storage.migration_safety import LockWaits, check_server_version
from outbox_pipelines.core.storage.queries import sql_dir

ALTER = "ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS upgrade_drill text;\n"


def _with_a_new_migration(tmp_path: Path) -> Path:
    """The shipped migrations and one more that needs an exclusive lock on a table the application writes."""
    copy = tmp_path / "migrations"
    shutil.copytree(sql_dir() / "migrations", copy)
    (copy / "0099_upgrade_drill.sql").write_text(ALTER)
    return copy


def _report_transaction(db_url: str, hold_s: float) -> threading.Thread:
    """An ordinary long transaction reading the table (a report): it holds a lock the ALTER must wait for."""
    started = threading.Event()

    def hold() -> None:
        with psycopg.connect(db_url, application_name="nightly-report") as conn:
            conn.execute("SELECT count(*) FROM outbox_events")
            started.set()
            time.sleep(hold_s)
            conn.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert started.wait(10)
    return thread


def _longest_enqueue_wait(db_url: str, for_s: float) -> float:
    """Enqueue one message at a time for ``for_s`` seconds, as the application does; the longest one took."""
    outbox, longest, n = Outbox("outbox_events"), 0.0, 0
    with psycopg.connect(db_url, autocommit=True) as conn:
        until = time.monotonic() + for_s
        while time.monotonic() < until:
            started = time.monotonic()
            outbox.enqueue(conn, Message(topic="t", payload={"n": n}), outside_transaction=True)
            longest, n = max(longest, time.monotonic() - started), n + 1
            time.sleep(0.02)
    return longest


@pytest.mark.parametrize("lock_timeout_s, bound_s", [(0.2, 0.8), (30.0, None)])
def test_a_migration_behind_a_long_transaction_holds_the_writes_no_longer_than_its_lock_timeout(
    db_url, tmp_path, lock_timeout_s, bound_s
):
    migrations = _with_a_new_migration(tmp_path)
    report = _report_transaction(db_url, hold_s=3.0)
    said: list[str] = []
    outcome: dict[str, object] = {}

    def upgrade() -> None:
        outcome["applied"] = migrate.upgrade(db_url, migrations, waits=LockWaits(lock_timeout_s, said=said.append))

    upgrading = threading.Thread(target=upgrade, daemon=True)
    upgrading.start()
    longest = _longest_enqueue_wait(db_url, for_s=2.0)
    report.join(10)
    upgrading.join(60)
    assert outcome["applied"] == ["0099_upgrade_drill.sql"]
    print(f"lock_timeout {lock_timeout_s:g} s: the longest enqueue during the upgrade took {longest:.3f} s")
    if bound_s is None:  # the old behaviour, for contrast: every write queued behind the waiting ALTER
        assert longest > 1.0, longest
        return
    assert longest < bound_s, f"an enqueue waited {longest:.2f} s behind the migration"
    assert said and "a lock was not granted in 0.2 s" in said[0] and "nightly-report" in said[0], said


def test_an_upgrade_that_never_gets_its_lock_gives_up_naming_the_transaction_and_applies_nothing(db_url, tmp_path):
    migrations = _with_a_new_migration(tmp_path)
    report = _report_transaction(db_url, hold_s=4.0)
    with pytest.raises(MigrationError, match=r"0099_upgrade_drill.sql could not take its locks in 1 s.*nightly-report"):
        migrate.upgrade(db_url, migrations, waits=LockWaits(lock_timeout_s=0.2, give_up_after_s=1.0))
    report.join(10)
    assert migrate.pending(db_url, migrations) == ["0099_upgrade_drill.sql"]
    with psycopg.connect(db_url) as conn:
        columns = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'outbox_events'"
            )
        }
    assert "upgrade_drill" not in columns


@pytest.mark.parametrize("version_num", [90624, 130012])
def test_a_server_older_than_the_oldest_supported_is_refused_before_anything_is_applied(version_num):
    with pytest.raises(
        MigrationError, match=r"older than the oldest this version supports \(14; supported: 14 to 18\)"
    ):
        check_server_version(version_num)


def test_the_supported_servers_pass_the_version_gate(conn):
    for version_num in (
        140000,
        170004,
        180001,
        conn.execute("SHOW server_version_num").fetchone()["server_version_num"],
    ):
        check_server_version(int(version_num))


def test_behind_a_long_transaction_the_upgrade_waits_for_it_to_end_without_queuing_then_tries_once_more(
    db_url, tmp_path
):
    migrations = _with_a_new_migration(tmp_path)
    report = psycopg.connect(db_url, application_name="nightly-report")
    report.execute("SELECT count(*) FROM outbox_events")  # holds a lock the ALTER must wait for, until it ends
    said: list[str] = []
    heard = threading.Event()
    outcome: dict[str, object] = {}

    def hear(line: str) -> None:
        said.append(line)
        heard.set()

    def upgrade() -> None:
        outcome["applied"] = migrate.upgrade(db_url, migrations, waits=LockWaits(0.2, said=hear))

    upgrading = threading.Thread(target=upgrade, daemon=True)
    upgrading.start()
    try:
        assert heard.wait(30), "the upgrade never met the report's lock"
        outbox, slowest, queued = Outbox("outbox_events"), 0.0, 0
        with psycopg.connect(db_url, autocommit=True) as probe:
            for n in range(15):  # 3 s while the report stays open: a backoff would have tried again 2 or 3 times
                queued += probe.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()[0]
                started = time.monotonic()
                outbox.enqueue(probe, Message(topic="t", payload={"n": n}), outside_transaction=True)
                slowest = max(slowest, time.monotonic() - started)
                time.sleep(0.2)
        assert queued == 0, "a session waited for a lock while the report was still open"
        assert slowest < 0.15, f"an enqueue waited {slowest:.2f} s while the upgrade waited for the report"
        assert "applied" not in outcome
    finally:
        report.rollback()
        report.close()
    upgrading.join(30)
    assert outcome["applied"] == ["0099_upgrade_drill.sql"]
    assert len(said) == 1, said
    assert "held by pid " in said[0] and "(nightly-report, idle in transaction" in said[0], said
    assert "trying again when that transaction ends" in said[0], said
