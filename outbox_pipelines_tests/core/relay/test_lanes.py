"""A backlog under the default claim: each full batch delivered whole commits on its connection while the next
is claimed on a second one (relay/lanes.py). The batch before is committed before the next is sent; a settle
whose connection dies is given back and sent again; a role that cannot open the second connection still drains."""

import os
import threading
import time
from collections import Counter
from itertools import count

import psycopg
import pytest
from psycopg import sql

from outbox_pipelines import Message, Outbox, Outcome
from outbox_pipelines.core.relay import Relay, liveness
from outbox_pipelines.core.relay.lease_keeper import LeaseKeeper
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, enqueue_n, rows, statuses

_roles = count()


def other_backends(conn, *mine: int) -> int:
    """Sessions on this test's database other than the test's own (``mine``): the relay's."""
    return conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> ALL(%s)",
        (list(mine),),
    ).fetchone()["n"]


def backends_gone(conn, *mine: int) -> bool:
    """The relay's sessions have left pg_stat_activity (a backend leaves it a moment after its client closes)."""
    deadline = time.monotonic() + 10
    while other_backends(conn, *mine) and time.monotonic() < deadline:
        time.sleep(0.01)
    return other_backends(conn, *mine) == 0


def test_each_batch_is_committed_before_the_next_is_sent_and_the_second_connection_closes(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 50)
    sent: list[int] = []
    seen: list[tuple[int, int, int]] = []  # (batch, rows of the batch before not yet sent, the relay's sessions)
    with psycopg.connect(db_url, autocommit=True) as probe:
        mine = (conn.info.backend_pid, probe.info.backend_pid)

        def record(msg):
            if len(sent) % 10 == 0 and sent:  # the first message of each batch after the first
                before = sent[-10:]
                unsent = probe.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE id = ANY(%s) AND status <> 'sent'").format(
                        sql.Identifier(EVENTS)
                    ),
                    (before,),
                ).fetchone()[0]
                sessions = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> ALL(%s)",
                    (list(mine),),
                ).fetchone()[0]
                seen.append((len(sent) // 10, unsent, sessions))
            sent.append(msg.id)
            return Outcome.sent()

        report = Relay(db_url, events_settings(batch_size=10), ScriptedDestination(record)).run(once=True)
        assert backends_gone(conn, *mine)  # the relay closed all three
    assert report.sent == 50
    assert sent == ids  # each once, in id order
    assert [unsent for _, unsent, _ in seen] == [0] * 4  # the batch before had committed
    # The relay's session, its lease keeper, and the second connection the next batch was claimed on.
    assert {sessions for _, _, sessions in seen} == {3}
    assert statuses(conn, EVENTS) == {"sent": 50}
    assert all(audit_codes(conn, EVENTS, i) == ["outbox_flush_success"] for i in ids)


KEYS = [f"k{n}" for n in range(4)]


def keyed_backlog(conn, per_key: int) -> tuple[list[str], ScriptedDestination]:
    """``per_key`` messages of each of KEYS, enqueued key after key (every batch of 4 holds one of each key); the
    event ids a destination is given, in order, and that destination."""
    messages = [
        Message(topic="t", payload={}, event_id=f"{k}-{r}", ordering_key=k) for r in range(per_key) for k in KEYS
    ]
    Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True)
    got: list[str] = []

    def record(msg):
        got.append(msg.event_id)
        return Outcome.sent()

    return got, ScriptedDestination(record)


def in_key_order(got: list[str], per_key: int) -> bool:
    return all([e for e in got if e.startswith(f"{key}-")] == [f"{key}-{r}" for r in range(per_key)] for key in KEYS)


def test_per_key_order_holds_across_the_two_connections(db_url, conn):
    got, destination = keyed_backlog(conn, 15)
    report = Relay(db_url, events_settings(batch_size=4), destination).run(max_seconds=30, max_entries=60)
    assert report.sent == 60
    assert Counter(got) == Counter(f"{k}-{r}" for k in KEYS for r in range(15))
    assert in_key_order(got, 15)


def test_a_one_shot_run_drains_a_keyed_backlog_whose_full_batch_held_every_key_s_head(db_url, conn):
    """``relay --once`` (and ``testing.relay_once``) drains what is ready, and a key's next message is ready once the
    message before it is sent. The claim made while the batch holding every key's head still commits finds nothing,
    because that batch releases them only at its commit: the run claims again once it has committed, and ends only
    when a claim beside no commit finds nothing (it ended with 4 of 12 sent)."""
    got, destination = keyed_backlog(conn, 3)
    report = Relay(db_url, events_settings(batch_size=4), destination).run(once=True)
    assert report.sent == 12, (report.sent, report.stopped_because)
    assert report.stopped_because == "nothing ready"
    assert in_key_order(got, 3)
    assert statuses(conn, EVENTS) == {"sent": 12}


def test_beside_another_live_relay_of_its_table_a_relay_settles_each_batch_first(db_url, conn):
    liveness.register(conn, "the-other-relay", EVENTS, None)  # alive: it heartbeat just now
    enqueue_n(conn, EVENTS, 30)
    sessions: list[int] = []
    with psycopg.connect(db_url, autocommit=True) as probe:
        mine = [conn.info.backend_pid, probe.info.backend_pid]

        def record(msg):
            sessions.append(
                probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> ALL(%s)",
                    (mine,),
                ).fetchone()[0]
            )
            return Outcome.sent()

        report = Relay(db_url, events_settings(batch_size=10), ScriptedDestination(record)).run(once=True)
    assert report.sent == 30
    assert set(sessions) == {2}  # its session and its lease keeper: the other relay claims while this one settles


@pytest.mark.parametrize("batch_cut", [1, 2], ids=["relay-session", "second-connection"])
def test_a_settle_whose_connection_dies_is_given_back_and_sent_again(db_url, conn, monkeypatch, batch_cut):
    ids = enqueue_n(conn, EVENTS, 40)
    events: list[tuple[str, list[int]]] = []  # ("noted", the batch on the relay's worker row) and ("sent", [id])
    note_held = LeaseKeeper.note_held

    def noting(keeper, held):
        events.append(("noted", [msg_id for msg_id, _ in held]))
        note_held(keeper, held)

    monkeypatch.setattr(LeaseKeeper, "note_held", noting)
    # The settle of one batch (the first: on the relay's session; the second: on the second connection) waits
    # at its first row once, long enough to have its backend terminated while the next batch is claimed.
    slow_id = ids[(batch_cut - 1) * 10]
    conn.execute("CREATE SEQUENCE slow_once")
    conn.execute(
        sql.SQL(
            "CREATE FUNCTION slow_settle() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.status = 'sent' AND OLD.id = {} AND nextval('slow_once') = 1 THEN PERFORM pg_sleep(5); END IF; "
            "RETURN NEW; END $$"
        ).format(sql.Literal(slow_id))
    )
    conn.execute(
        sql.SQL("CREATE TRIGGER slow_settle BEFORE UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION slow_settle()").format(
            sql.Identifier(EVENTS)
        )
    )
    terminated: list[int] = []

    def cut() -> None:
        with psycopg.connect(db_url, autocommit=True) as killer:
            deadline = time.monotonic() + 20
            while not terminated and time.monotonic() < deadline:
                for (pid,) in killer.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()"
                ).fetchall():
                    killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    terminated.append(pid)
                time.sleep(0.01)

    killer = threading.Thread(target=cut)
    killer.start()
    delivered: Counter[int] = Counter()

    def record(msg):
        delivered[msg.id] += 1
        events.append(("sent", [msg.id]))
        return Outcome.sent()

    try:
        report = Relay(db_url, events_settings(batch_size=10), ScriptedDestination(record)).run(once=True)
    finally:
        killer.join()
    assert len(terminated) == 1
    cut_batch = ids[(batch_cut - 1) * 10 : batch_cut * 10]
    # Nothing lost: every row sent; the batch whose settle died went again (at least once), the rest once.
    assert statuses(conn, EVENTS) == {"sent": 40}
    assert {i: delivered[i] for i in cut_batch} == {i: 2 for i in cut_batch}
    assert all(delivered[i] == 1 for i in ids if i not in cut_batch)
    assert report.db_errors == 1
    assert all("outbox_flush_db_error" in audit_codes(conn, EVENTS, i) for i in cut_batch)
    assert all(r["attempts"] == 1 for r in rows(conn, EVENTS) if r["id"] not in cut_batch)
    # Each batch noted was sent before the next note, or its note was withdrawn (a batch claimed while the cut one
    # committed is given back unsent): a note left behind would have burying the relay count an unsent attempt.
    noted: list[int] = []
    for kind, batch in events:
        if kind == "sent" and batch[0] in noted:
            noted = []
        elif kind == "noted":
            assert not noted or not batch, f"batch {noted} noted, never sent, and its note replaced by {batch}"
            noted = batch


@pytest.fixture
def two_connection_url(db_url: str):
    """A role that may hold two connections: the relay's session and its lease keeper, no more."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    role = f"obx_two_{os.getpid()}_{next(_roles)}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 2 PASSWORD 'pw'").format(sql.Identifier(role)))
        for grant in ("GRANT ALL ON SCHEMA public TO {}", "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}"):
            admin.execute(sql.SQL(grant).format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(sql.Identifier(role)))
    yield f"postgresql://{role}:pw@/{info['dbname']}?host={info['host']}&port={info.get('port', 5432)}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_at_its_connection_limit_drains_settling_each_batch_first(two_connection_url, conn, caplog):
    enqueue_n(conn, EVENTS, 30)
    report = Relay(two_connection_url, events_settings(batch_size=10), ScriptedDestination()).run(once=True)
    assert (report.sent, report.db_errors) == (30, 0)
    assert statuses(conn, EVENTS) == {"sent": 30}
    said = [r.getMessage() for r in caplog.records if "second connection" in r.getMessage()]
    assert len(said) == 1 and "each batch settles first" in said[0]
    assert "pw" not in said[0]
