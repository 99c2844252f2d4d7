"""A database of the previous version upgraded beside its application: the expand (0010-0014) builds what this
version needs concurrently and keeps what the previous version's relays use; the contract step (`db upgrade
--contract`) drops that later, and only once no relay of before the upgrade runs. An upgrade killed at any step
leaves no backend waiting and no INVALID index behind the rerun."""

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage import migrate
from outbox_pipelines.core.storage.migration_safety import LockWaits
from outbox_pipelines_tests.conftest import CLI, run_cli
from outbox_pipelines_tests.core.earlier_versions import migrations_before_parts

ROWS = 50_000
UPGRADE = migrate.UPGRADE_APPLICATION_NAME


def _previous_version(url: str, tmp_path: Path, *, then_up_to: str = "", at: str = "0009") -> None:
    """A database an earlier version migrated up to ``at`` (0009: the version before ordering), with ROWS messages,
    most of them sent; then this version's migrations up to ``then_up_to`` (an upgrade stopped there)."""
    migrate.upgrade(url, migrations_before_parts(tmp_path, at))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_events (event_id, topic, payload, payload_sha, status, published_at) "
            "SELECT 'e-' || n, 't', '{}', 's', CASE WHEN n %% 10 = 0 THEN 'pending' ELSE 'sent' END, now() "
            "FROM generate_series(1, %s) AS n",
            (ROWS,),
        )
    if then_up_to:
        partial = tmp_path / f"this_version_to_{then_up_to}"
        partial.mkdir()
        for m in migrate.discover():
            if m.version <= then_up_to:
                shutil.copy(m.path, partial / m.path.name)
        migrate.upgrade(url, partial)


def _indexes(conn: psycopg.Connection, table: str) -> set[str]:
    """Each index of ``table`` as its definition, the table's name taken out (to compare two tables)."""
    rows = conn.execute(
        "SELECT pg_get_indexdef(i.indexrelid) AS d FROM pg_index AS i WHERE i.indrelid = %s::regclass", (table,)
    ).fetchall()
    return {str(row[0]).replace(table, "T") for row in rows}


def _invalid(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid")]


class OldProducer:
    """The previous version's producer: a plain INSERT of its columns every 10 ms; the longest one it waited."""

    def __init__(self, url: str) -> None:
        self.url, self.longest, self.errors, self.written = url, 0.0, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    conn.execute(
                        "INSERT INTO outbox_events (event_id, topic, payload, payload_sha) VALUES (%s, 't', '{}', 's')",
                        (f"live-{self.written}",),
                    )
                    self.written += 1
                except psycopg.Error as exc:
                    self.errors.append(str(exc))
                self.longest = max(self.longest, time.monotonic() - started)
                time.sleep(0.01)

    def __enter__(self) -> "OldProducer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("at", ["0005", "0009"])
def test_the_previous_versions_database_upgrades_without_stopping_its_writes(empty_db, tmp_path, at):
    _previous_version(empty_db, tmp_path, at=at)
    with OldProducer(empty_db) as producer:
        applied = migrate.upgrade(empty_db)
    assert applied == [m.name for m in migrate.discover() if m.version > at]
    assert producer.errors == [] and producer.written > 0
    print(f"longest write of the previous version's producer during the upgrade: {producer.longest:.3f} s")
    assert producer.longest < 1.0, producer.longest
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert _invalid(conn) == []
        conn.execute("SELECT outbox_create_table('fresh_events')")
        fresh, upgraded = _indexes(conn, "fresh_events"), _indexes(conn, "outbox_events")
        # What this version's new tables have, and the previous version's claim index, kept for its relays.
        kept = "CREATE INDEX T_pending_by_id ON public.T USING btree (id) WHERE (status = 'pending'::text)"
        assert upgraded - fresh == {kept}
        assert fresh <= upgraded
        assert conn.execute("SELECT count(*) FROM outbox_events").fetchone()[0] == ROWS + producer.written


def test_the_contract_step_waits_for_the_relays_of_before_the_upgrade(empty_db, tmp_path):
    _previous_version(empty_db, tmp_path)
    with pytest.raises(MigrationError, match=r"expand first: 0010_ordering.sql, .* not applied"):
        migrate.upgrade(empty_db, contract=True)
    migrate.upgrade(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_relay_workers (worker, table_name, host, pid, started_at, heartbeat_at) "
            "VALUES ('relay-old', 'outbox_events', 'app-1', 4242, now() - interval '1 hour', now())"
        )
        with pytest.raises(MigrationError, match=r"1 relay\(s\) started before the last upgrade .* relay-old"):
            migrate.upgrade(empty_db, contract=True)
        assert "outbox_events_pending_by_id" in str(_indexes(conn, "outbox_events")).replace("T_", "outbox_events_")
        conn.execute("UPDATE outbox_relay_workers SET stopped_at = now(), stop_reason = 'finished'")
        assert migrate.upgrade(empty_db, contract=True) == [
            "contract/0001_drop_pending_by_id.sql",
            "contract/0002_keyed_ready_when_far.sql",
        ]
        conn.execute("SELECT outbox_create_table('fresh_events')")
        assert _indexes(conn, "outbox_events") == _indexes(conn, "fresh_events")
    assert migrate.upgrade(empty_db, contract=True) == []


def test_db_status_and_the_cli_show_and_run_the_contract_step(empty_db, cli_env, tmp_path):
    _previous_version(empty_db, tmp_path)
    env = {**cli_env, "OUTBOX_DATABASE_URL": empty_db}
    assert run_cli(env, "db", "upgrade").returncode == 0
    status = run_cli(env, "db", "status")
    waiting = "contract/0001_drop_pending_by_id.sql, contract/0002_keyed_ready_when_far.sql not applied"
    assert f"contract: {waiting}" in status.stdout, status.stdout
    plan = run_cli(env, "db", "upgrade", "--contract", "--dry-run")
    assert "DROP INDEX CONCURRENTLY IF EXISTS outbox_events_pending_by_id;" in plan.stdout, plan.stdout
    script = run_cli(env, "db", "upgrade", "--contract", "--sql").stdout
    assert "SET lock_timeout = 0;\nDROP INDEX CONCURRENTLY IF EXISTS outbox_events_pending_by_id;" in script
    done = run_cli(env, "db", "upgrade", "--contract")
    assert done.returncode == 0 and "applied contract/0002_keyed_ready_when_far.sql" in done.stdout, done.stderr
    assert "contract:" not in run_cli(env, "db", "status").stdout


def test_a_new_database_has_no_contract_step_waiting(cli_env):
    status = run_cli(cli_env, "db", "status")
    assert status.returncode == 0 and "contract:" not in status.stdout, status.stdout


@pytest.fixture
def held() -> Iterator[list[psycopg.Connection]]:
    """Transactions a test holds open (a report, a slow business transaction); ended after it."""
    conns: list[psycopg.Connection] = []
    yield conns
    for conn in conns:
        conn.close()


def _hold(url: str, held: list[psycopg.Connection], statement: str, isolation: str = "READ COMMITTED") -> None:
    conn = psycopg.connect(url, application_name="held-by-the-test")
    conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
    conn.execute(statement)
    held.append(conn)


def _upgrade_backends(conn: psycopg.Connection) -> list[tuple[int, str, str]]:
    return conn.execute(
        "SELECT pid, coalesce(wait_event_type, ''), query FROM pg_stat_activity WHERE application_name = %s",
        (UPGRADE,),
    ).fetchall()


def _wait_for(predicate, timeout_s: float = 30.0) -> bool:
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.1)
    return False


# Where the upgrade is stopped (this version's migrations applied before it, what the test holds open, the
# statement the upgrade's session is then waiting in).
KILL_POINTS = {
    "an ALTER waiting for its lock (0011)": (
        "0010",
        "SELECT 1 FROM outbox_audit LIMIT 1",
        "READ COMMITTED",
        "ALTER TABLE outbox_audit ADD COLUMN claimed_at",
    ),
    "the audit's concurrent build (0012)": (
        "0011",
        "SELECT 1 FROM outbox_relay_workers",
        "REPEATABLE READ",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_audit_by_message_brin",
    ),
    "an ordering index's concurrent build (0014)": (
        "0013",
        "SELECT 1 FROM outbox_relay_workers",
        "REPEATABLE READ",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_ready_by_id",
    ),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_an_upgrade_killed_at_a_step_leaves_nothing_waiting_and_the_rerun_completes(
    point,
    empty_db,
    cli_env,
    tmp_path,
    held,
):
    applied_before, holding, isolation, waiting_in = KILL_POINTS[point]
    _previous_version(empty_db, tmp_path, then_up_to=applied_before)
    env = {**cli_env, "OUTBOX_DATABASE_URL": empty_db}
    _hold(empty_db, held, holding, isolation)
    upgrading = subprocess.Popen([*CLI, "db", "upgrade"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with psycopg.connect(empty_db, autocommit=True) as watch:
        try:
            assert _wait_for(
                lambda: any(wait == "Lock" and waiting_in in query for _, wait, query in _upgrade_backends(watch))
            ), _upgrade_backends(watch)
            time.sleep(0.1)  # inside the wait, not at its start
        finally:
            os.kill(upgrading.pid, signal.SIGKILL)
            upgrading.wait(10)
        # The killed upgrade's backend leaves within the server's check of its client (1 s), even from a wait
        # that has no timeout of its own (a concurrent build waiting for an older transaction).
        assert _wait_for(lambda: not _upgrade_backends(watch), 5.0), _upgrade_backends(watch)
        held.pop().close()
        rerun = run_cli(env, "db", "upgrade", timeout=120)
        assert rerun.returncode == 0, rerun.stderr
        assert _invalid(watch) == []
        assert migrate.pending(empty_db) == []
        watch.execute("SELECT outbox_create_table('fresh_events')")
        assert _indexes(watch, "fresh_events") <= _indexes(watch, "outbox_events")


def _applied(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM outbox_schema_migrations").fetchone()[0])


def _kill_once_it_got_further(upgrading: subprocess.Popen, watch: psycopg.Connection, applied_before: int) -> bool:
    """SIGKILL ``upgrading`` in the middle of a statement, as soon as it has applied more than ``applied_before``
    migrations (progress read from the database, not guessed from the clock); False if it finished first."""
    while upgrading.poll() is None:
        mid_statement = any(wait != "Client" for _, wait, _ in _upgrade_backends(watch))
        if _applied(watch) > applied_before and mid_statement:
            os.kill(upgrading.pid, signal.SIGKILL)
            upgrading.wait(10)
            return True
        time.sleep(0.005)
    return False


def test_an_upgrade_killed_again_and_again_completes_when_let_run(empty_db, cli_env, tmp_path):
    """SIGKILL at moments spread over the whole upgrade (from before 0006's text to today's), each once the last
    kill's rerun got one migration further: whatever step each one hit, the final run completes with nothing
    INVALID."""
    _previous_version(empty_db, tmp_path, at="0005")
    env = {**cli_env, "OUTBOX_DATABASE_URL": empty_db}
    kills = 0
    with psycopg.connect(empty_db, autocommit=True) as watch:
        for _ in range(8):
            applied_before = _applied(watch)
            upgrading = subprocess.Popen(
                [*CLI, "db", "upgrade"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            if not _kill_once_it_got_further(upgrading, watch, applied_before):
                break
            kills += 1
            assert _wait_for(lambda: not _upgrade_backends(watch), 5.0), _upgrade_backends(watch)
        final = run_cli(env, "db", "upgrade", timeout=120)
        assert final.returncode == 0, final.stderr
        print(f"killed {kills} times")
        assert kills >= 2, "the upgrade finished before it could be killed twice: load more rows"
        assert _invalid(watch) == [] and migrate.pending(empty_db) == []
        watch.execute("SELECT outbox_create_table('fresh_events')")
        assert _indexes(watch, "fresh_events") <= _indexes(watch, "outbox_events")


def test_a_table_that_has_its_ordering_is_not_locked_again(empty_db, tmp_path, held):
    """A database that ran 0010 before 0014 existed (the previous version's): 0014 neither alters its tables nor
    recreates their triggers, so a transaction holding a table does not make the upgrade wait at all."""
    _previous_version(empty_db, tmp_path, at="0012")
    _hold(empty_db, held, "SELECT 1 FROM outbox_events LIMIT 1")
    started = time.monotonic()
    steps = migrate.concrete_steps(empty_db, [m for m in migrate.discover() if m.version == "0014"])["0014"]
    assert [s for s in steps if not s.startswith("CREATE INDEX CONCURRENTLY")] == [], steps
    said: list[str] = []
    # Up to 0020, which adds a column to every table and so waits behind the holder, under the lock timeout, as a
    # column added does (test_payload_limit.py::test_adding_the_trigger_gives_way_to_the_application).
    before_0020 = tmp_path / "before_0020"
    before_0020.mkdir()
    for m in migrate.discover():
        if m.version < "0020":
            shutil.copy(m.path, before_0020 / m.path.name)
    migrate.upgrade(empty_db, before_0020, waits=LockWaits(0.2, give_up_after_s=5.0, said=said.append))
    assert said == [] and time.monotonic() - started < 5.0, said
