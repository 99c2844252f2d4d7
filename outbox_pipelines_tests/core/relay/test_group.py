"""Relay groups (issue 23): one process relays many tables; a quiet table costs nothing; one table's trouble
stays its own. A real PostgreSQL, tables made with create_table, the group on a thread of the test."""

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from outbox_pipelines import HandlerRegistry, Message, Outbox
from outbox_pipelines.core.destinations import HandlerDestination
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.relay.destination_health import read_health
from outbox_pipelines.core.relay.group import GroupRelay, run_group_relay
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines_tests.helpers import statuses, wait_until

TABLES = [f"mod{n:02d}_outbox" for n in range(8)]


def group_settings(tmp_path: Path, tables: list[str], extra: str = "") -> Settings:
    config = tmp_path / "outbox.toml"
    config.write_text(
        "".join(
            f'[tables.{name}]\ndestination = "paper"\nmode = "competing"\nbase = "10ms"\nmax_backoff = "10ms"\n\n'
            for name in tables
        )
        + extra
    )
    return load_settings(env={}, path=config)


class Counting:
    """In-process handlers for every table: counts each message (by table and event id) it handled."""

    def __init__(self) -> None:
        self.handled: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()

    def build(self, table: TableSettings, settings: Settings) -> Destination:
        registry = HandlerRegistry()

        def handle(message) -> None:
            with self.lock:
                self.handled[(table.name, message.event_id)] += 1

        registry.register("t", handle)
        return HandlerDestination(registry, name=f"count:{table.name}")


@pytest.fixture
def tables(db_url: str) -> list[str]:
    for name in TABLES:
        create_table(db_url, name)
    return TABLES


def enqueue(conn, table: str, n: int, prefix: str = "m") -> None:
    Outbox(table).enqueue_many(
        conn,
        [Message(topic="t", payload={"n": i}, event_id=f"{prefix}{i}") for i in range(n)],
        outside_transaction=True,
    )


@contextmanager
def group_running(db_url: str, settings: Settings, names: list[str], **knobs) -> Iterator[GroupRelay]:
    counting = knobs.pop("destinations", None) or Counting().build
    group = GroupRelay(db_url, settings, names, worker_prefix="test", destinations=counting, **knobs)
    thread = threading.Thread(target=group.run, kwargs={"max_seconds": 60})
    thread.start()
    try:
        yield group
    finally:
        group.request_stop()
        thread.join(30)
        assert not thread.is_alive()


def relay_connections(conn) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' OR application_name LIKE 'outbox%%'"
    ).fetchone()["n"]


def test_once_drains_every_table_each_message_once(db_url, conn, tables, tmp_path):
    for name in tables:
        enqueue(conn, name, 30)
    counting = Counting()
    group = GroupRelay(
        db_url, group_settings(tmp_path, tables), tables, worker_prefix="t", places=3, destinations=counting.build
    )
    report = group.run(once=True)
    assert {name: statuses(conn, name) for name in tables} == {name: {"sent": 30} for name in tables}
    assert len(counting.handled) == 8 * 30 and set(counting.handled.values()) == {1}
    assert {name: r.sent for name, r in report.tables.items()} == dict.fromkeys(tables, 30)
    assert report.outcome == "delivered" and not report.problems


def test_a_running_group_wakes_a_quiet_table_on_enqueue_and_lets_go_when_idle(db_url, conn, tables, tmp_path):
    settings = group_settings(tmp_path, tables)
    counting = Counting()
    with group_running(db_url, settings, tables, destinations=counting.build, linger_s=0.5) as group:
        # every table is looked at once at the start, then goes quiet: no relay holds a connection
        wait_until(
            lambda: (
                not any(w.active for w in group.workers.values()) and all(w.activations for w in group.workers.values())
            ),
            20,
            "every table to go quiet",
        )
        enqueue(conn, "mod03_outbox", 5, prefix="late")
        wait_until(lambda: statuses(conn, "mod03_outbox") == {"sent": 5}, 10, "the enqueue to be relayed")
        assert group.workers["mod03_outbox"].activations >= 2
        assert group.workers["mod05_outbox"].activations == 1  # quiet tables were not woken
        wait_until(lambda: not group.workers["mod03_outbox"].active, 10, "mod03 to go quiet again")
    assert {k[1] for k in counting.handled} == {f"late{i}" for i in range(5)}


def test_places_bound_the_active_tables_and_every_table_gets_its_turn(db_url, conn, tables, tmp_path):
    """8 busy tables, 2 places: each table takes turns (slices), none starves."""
    for name in tables:
        enqueue(conn, name, 400)
    release = threading.Event()

    def slow(table: TableSettings, settings: Settings) -> Destination:
        registry = HandlerRegistry()
        registry.register("t", lambda message: time.sleep(0.002))
        return HandlerDestination(registry)

    peak = []
    with group_running(
        db_url, group_settings(tmp_path, tables), tables, destinations=slow, places=2, slice_s=0.3
    ) as group:

        def all_sent() -> bool:
            peak.append(sum(w.active for w in group.workers.values()))
            return all(statuses(conn, name) == {"sent": 400} for name in tables)

        wait_until(all_sent, 60, "every table drained", interval_s=0.05)
        release.set()
    assert max(peak) <= 2


def test_a_table_that_cannot_be_built_or_does_not_exist_is_told_once_and_the_others_relay(
    db_url, conn, tables, tmp_path, monkeypatch
):
    # A marked factory that returns no HandlerRegistry: the destination cannot be built when the relay starts.
    (tmp_path / "group_wrong_factory.py").write_text(
        "from outbox_pipelines import HandlerRegistry\n\nregistry = HandlerRegistry.factory(lambda: 'not one')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = (
        '[tables.broken_outbox]\ndestination = "handlers"\nhandlers = "group_wrong_factory:registry"\n\n'
        '[tables.unimportable_outbox]\ndestination = "handlers"\nhandlers = "no_such_module:r"\n'
    )
    settings = group_settings(tmp_path, [*tables, "missing_outbox"], extra)
    for name in ("broken_outbox", "unimportable_outbox"):
        create_table(db_url, name)
        enqueue(conn, name, 3)
    enqueue(conn, "mod01_outbox", 3)
    # A module that does not import is the settings' to tell, at load: that table never joins a group.
    assert "cannot import no_such_module" in settings.broken["unimportable_outbox"]
    assert "unimportable_outbox" not in settings.groups()["default"]
    report = run_group_relay(db_url, settings, "default", once=True, worker_prefix="t")
    assert statuses(conn, "mod01_outbox") == {"sent": 3}
    assert statuses(conn, "broken_outbox") == {"pending": 3}  # nothing lost, nothing claimed
    assert statuses(conn, "unimportable_outbox") == {"pending": 3}
    assert "is not a HandlerRegistry" in report.problems["broken_outbox"]
    assert "does not exist in the database" in report.problems["missing_outbox"]
    assert report.outcome == "table_problems"
    health = read_health(conn, "broken_outbox")
    assert "is not a HandlerRegistry" in health.relay_problem and health.relay_problem_since is not None


class ExplodingLedger(Destination):
    """A destination whose after_settle raises: the relay itself fails, after delivering."""

    writes_on_settle = True

    def __init__(self) -> None:
        self.calls = 0

    def deliver(self, messages):
        from outbox_pipelines.core.models import Outcome

        return [Outcome.sent() for _ in messages]

    def after_settle(self, conn, settled) -> None:
        self.calls += 1
        raise RuntimeError("the ledger is full")


def test_a_relay_that_raises_is_told_once_retried_with_backoff_and_the_others_go_on(db_url, conn, tables, tmp_path):
    exploding = ExplodingLedger()
    counting = Counting()

    def build(table: TableSettings, settings: Settings) -> Destination:
        return exploding if table.name == "mod00_outbox" else counting.build(table, settings)

    with group_running(db_url, group_settings(tmp_path, tables), tables, destinations=build, linger_s=0.3) as group:
        enqueue(conn, "mod00_outbox", 2)
        wait_until(lambda: group.workers["mod00_outbox"].problem, 10, "the failing relay to be told")
        for name in tables[1:]:
            enqueue(conn, name, 10)
        wait_until(lambda: all(statuses(conn, name) == {"sent": 10} for name in tables[1:]), 15, "the others")
        assert "RuntimeError: the ledger is full" in group.workers["mod00_outbox"].problem
        assert exploding.calls <= 2  # backoff: not tried again at once and again and again
        assert "ledger is full" in read_health(conn, "mod00_outbox").relay_problem


def test_a_group_with_no_table_to_relay_says_which_groups_there_are(db_url, tmp_path):
    settings = group_settings(tmp_path, ["mod00_outbox"])
    with pytest.raises(ConfigError, match="relay group 'billing' has no table to relay; groups: default"):
        run_group_relay(db_url, settings, "billing", once=True, worker_prefix="t")


def test_a_standby_takes_over_a_single_active_table_at_once_when_its_holder_stops(db_url, conn, tables, tmp_path):
    """A hand-off: the next group run's relay of a single-active table stands by on its lock; when the previous
    run's relay lets go, it claims at once (it was let go as idle before, and the table waited ~1 s)."""
    config = tmp_path / "outbox.toml"
    config.write_text('[tables.mod00_outbox]\ndestination = "paper"\nmode = "single-active"\n')
    settings = load_settings(env={}, path=config)
    counting = Counting()
    holder = Relay(db_url, settings.table("mod00_outbox"), counting.build(settings.table("mod00_outbox"), settings))
    holding = threading.Thread(target=holder.run, kwargs={"max_seconds": 60})
    holding.start()
    wait_until(
        lambda: conn.execute("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'").fetchone()["n"],
        10,
        "the first relay to hold the lock",
    )
    with group_running(db_url, settings, ["mod00_outbox"], destinations=counting.build, linger_s=2.0) as group:
        wait_until(lambda: group.workers["mod00_outbox"].active, 10, "the group's relay to stand by")
        time.sleep(3)  # longer than linger_s: standing by is not idleness
        holder.request_stop()
        holding.join(10)
        enqueue(conn, "mod00_outbox", 1, prefix="after-handoff")
        committed = time.monotonic()
        wait_until(
            lambda: statuses(conn, "mod00_outbox") == {"sent": 1}, 5, "the message after the hand-off", interval_s=0.01
        )
        assert time.monotonic() - committed < 0.5
        assert group.workers["mod00_outbox"].activations == 1  # the standby took over; no new activation
