"""Nothing moves without a trace, and no login stalls a commit (issue 42, migrations 0017 and 0018).

Every test logs in as login roles of its own (unique names, dropped at the end), members of the group
roles ``db grant`` makes, or of none: what a login can do is what its grants let it, never what the
test's owner connection could.
"""

import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow, dict_row

from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import COPY_MIN_ROWS, Outbox
from outbox_pipelines.core.models import ClaimedMessage, Message, Outcome
from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
from outbox_pipelines.core.operations import maintenance
from outbox_pipelines.core.operations.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.relay import Relay, ordering
from outbox_pipelines.core.settings import CheckThresholds
from outbox_pipelines.core.storage import roles
from outbox_pipelines.core.storage.table import OutboxTable, Settlement
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, enqueue_n
from outbox_pipelines_tests.rows import make_dead

DictConnection = psycopg.Connection[DictRow]
Login = Callable[..., tuple[str, str]]
EVENTS = "outbox_events"
UNTOLD = "outbox_untold_change"


@pytest.fixture
def login(db_url: str) -> Iterator[Login]:
    """``login(group)``: a new login role, member of ``group`` (None: of no group); its name and URL."""
    roles.grant_roles(db_url)
    made: list[str] = []
    params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(db_url).items() if v is not None}
    database = params.pop("dbname")

    def make(group: str | None, application_name: str = "") -> tuple[str, str]:
        name = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}_{(group or 'nobody').removeprefix('outbox_')}"
        password = secrets.token_hex(16)
        member = sql.SQL(" IN ROLE {}").format(sql.Identifier(group)) if group else sql.SQL("")
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}{}").format(
                    sql.Identifier(name), sql.Literal(password), member
                )
            )
        made.append(name)
        extra = {"application_name": application_name} if application_name else {}
        return name, f"postgresql:///{database}?" + urlencode({**params, "user": name, "password": password, **extra})

    yield make
    with psycopg.connect(db_url, autocommit=True) as admin:
        for name in made:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _as(url: str) -> psycopg.Connection[DictRow]:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def _untold(conn: DictConnection) -> list[dict[str, object]]:
    return conn.execute(
        "SELECT message_id, from_status, to_status, login, worker, detail FROM outbox_audit "
        "WHERE code = %s ORDER BY id",
        (UNTOLD,),
    ).fetchall()


def test_a_relay_login_marking_a_pending_row_sent_by_hand_is_audited_with_its_login(
    login: Login, conn: DictConnection
) -> None:
    name, url = login(roles.RELAY)
    [row_id] = enqueue_n(conn, EVENTS, 1)
    with _as(url) as relay:
        relay.execute("UPDATE outbox_events SET status = 'sent', published_at = now() WHERE id = %s", (row_id,))
    [found] = _untold(conn)
    assert found["message_id"] == row_id and (found["from_status"], found["to_status"]) == ("pending", "sent")
    assert found["login"] == name and found["worker"] is None


def test_the_check_after_a_login_s_statement_reads_its_rows_once_whatever_its_session_planned_first(
    login: Login, conn: DictConnection
) -> None:
    """The check after a login's UPDATE kept a plan its session made for one row: it paired every old row with every
    new one, and each changed row with every audit row of its transaction (5.5 ms of a relay's 9.6 ms settle of 100;
    migration 0026). Here the session's first eight UPDATEs change a row each; then 4,000 rows by hand must cost
    about ten times 400 (one took 176 s before), and are still audited, as one row each statement."""
    _, url = login(roles.RELAY)
    ids = enqueue_n(conn, EVENTS, 8 + 2 * 400 + 2 * 4_000)
    firsts, rest = ids[:8], ids[8:]
    chunks = [rest[:400], rest[400:800], rest[800:4_800], rest[4_800:]]
    seconds = []
    with _as(url) as relay:
        relay.execute("SET statement_timeout = '20s'")  # the quadratic check took 176 s for 4,000 rows
        for row_id in firsts:  # past PostgreSQL's first five custom plans: the session keeps one made for a row
            relay.execute("UPDATE outbox_events SET status = 'sent' WHERE id = %s", (row_id,))
        for chunk in chunks:
            started = time.perf_counter()
            relay.execute("UPDATE outbox_events SET status = 'sent' WHERE id = ANY(%s)", (chunk,))
            seconds.append(time.perf_counter() - started)
    per_row_small = max(seconds[:2]) / 400
    per_row_big = max(seconds[2:]) / 4_000
    assert per_row_big < 4 * per_row_small, (
        f"4,000 rows cost {per_row_big / per_row_small:.1f}x a row of 400 ({[round(s * 1000) for s in seconds]} ms)"
    )
    found = _untold(conn)
    assert [(r["from_status"], r["to_status"]) for r in found] == [("pending", "sent")] * 12
    assert [str(r["detail"]).split(" (")[0] for r in found[-2:]] == [
        "status: 4000 rows that no audit row of their statement tells"
    ] * 2


def test_replays_deletions_and_skips_by_hand_are_audited_with_the_login(login: Login, conn: DictConnection) -> None:
    name, url = login(roles.MAINTAINER)
    ids = enqueue_n(conn, EVENTS, 4)
    conn.execute("UPDATE outbox_events SET ordering_key = 'k' || id WHERE id = ANY(%s)", (ids,))
    make_dead(conn, EVENTS, ids, attempts=5)
    with _as(url) as maintainer:
        maintainer.execute("UPDATE outbox_events SET status = 'pending', attempts = 0 WHERE id = %s", (ids[0],))
        maintainer.execute("DELETE FROM outbox_events WHERE id = %s", (ids[1],))
        maintainer.execute("UPDATE outbox_events SET ordering_skipped_at = now() WHERE id = %s", (ids[2],))
        maintainer.execute("UPDATE outbox_events SET attempts = 0 WHERE id = %s", (ids[3],))
        maintainer.execute("UPDATE outbox_events SET status = 'sent' WHERE id = ANY(%s)", (ids[2:],))
    found = _untold(conn)
    assert [(r["message_id"], r["from_status"], r["to_status"]) for r in found] == [
        (ids[0], "dead", "pending"),
        (ids[1], "dead", "deleted"),
        (ids[2], "dead", "dead"),
        (ids[3], "dead", "dead"),
        (None, "dead", "sent"),
    ]
    assert {r["login"] for r in found} == {name}
    assert [str(r["detail"]).split(":")[0] for r in found] == [
        "status",
        "deleted",
        "passed over",
        "attempts lowered",
        "status",
    ]
    assert f"ids {ids[2]}, {ids[3]}" in str(found[-1]["detail"])


def test_the_engine_s_own_statements_add_nothing_and_their_rows_name_the_login(
    login: Login, conn: DictConnection, db_url: str
) -> None:
    """A relay, a replay, a skip, the sweeps and a clean-up as the roles' logins: every change they make is
    audited by their own statements, so the database adds no row; every audit row names its login."""
    relay_name, relay_url = login(roles.RELAY)
    maintainer_name, maintainer_url = login(roles.MAINTAINER)
    ids = enqueue_n(conn, EVENTS, 4)
    enqueue_n(conn, "outbox_members", 2)  # deleted on success
    outcomes = {ids[0]: Outcome.sent(), ids[1]: Outcome.dead("BAD_REQUEST", "no"), ids[2]: Outcome.retry("X", "later")}
    destination = ScriptedDestination(lambda msg: outcomes.get(msg.id, Outcome.sent()))
    for table in (EVENTS, "outbox_members"):
        Relay(relay_url, table_settings(table), destination).run(once=True)
        Relay(relay_url, table_settings(table, claim="transaction"), destination).run(once=True)
    replay_dead(maintainer_url, EVENTS, ReplayFilter(ids=[ids[1]]), actor="cli:alice")
    maintenance.requeue_stuck(maintainer_url, table_settings(EVENTS))
    make_dead(conn, EVENTS, ids[3])
    conn.execute("UPDATE outbox_events SET ordering_key = 'k' WHERE id = %s", (ids[3],))
    with _as(maintainer_url) as operator:
        table = OutboxTable(operator, EVENTS)
        table.skip_dead_heads("cli:alice", ids=[ids[3]], ordering_key=None, reason="by hand", dry_run=False, limit=10)
    maintenance.clean(maintainer_url, table_settings(EVENTS), retention_s=0.0, dead_retention_s=0.0, force=True)
    assert _untold(conn) == []
    logins = {r["login"] for r in conn.execute("SELECT DISTINCT login FROM outbox_audit").fetchall()}
    assert logins == {relay_name, maintainer_name}


def test_a_relay_login_s_keyed_drain_releases_each_key_in_order_and_adds_no_audit_row(
    login: Login, conn: DictConnection
) -> None:
    """A settle releases each key's next message (an UPDATE of ordering_blocked alone): the check finds that no
    row's state moved and adds nothing, and the keys still go in order."""
    _, url = login(roles.RELAY)
    outbox = Outbox(EVENTS)
    for n in range(30):
        outbox.enqueue(conn, Message(topic="t", payload={"n": n}, ordering_key=f"k{n % 3}"), outside_transaction=True)
    delivered: list[tuple[str, int]] = []

    def record(msg: ClaimedMessage) -> Outcome:
        delivered.append((str(msg.ordering_key), int(msg.payload["n"])))
        return Outcome.sent()

    for _ in range(12):  # each pass sends each key's head, and its settle releases the next
        Relay(url, table_settings(EVENTS), ScriptedDestination(record)).run(once=True)
    assert sorted(delivered) == sorted((f"k{n % 3}", n) for n in range(30))
    for key in ("k0", "k1", "k2"):
        sent = [n for k, n in delivered if k == key]
        assert sent == sorted(sent), (key, sent)
    assert _untold(conn) == []


def test_under_audit_failures_a_statement_s_unaudited_deliveries_are_one_row(
    login: Login, conn: DictConnection
) -> None:
    name, url = login(roles.RELAY)
    enqueue_n(conn, EVENTS, 5)
    with _as(url) as relay:
        table = OutboxTable(relay, EVENTS)
        batch = table.claim("w", 10, 30, audit_claims=False)
        table.settle_sent(
            "w", [b.id for b in batch], [b.attempts for b in batch], audit_code=m.AUDIT_SUCCESS, audit_successes=False
        )
    found = _untold(conn)
    assert [(r["from_status"], r["to_status"], r["message_id"]) for r in found] == [
        ("pending", "sending", None),
        ("sending", "sent", None),
    ]
    assert all(r["login"] == name and "5 rows" in str(r["detail"]) for r in found)


def test_an_audit_row_cannot_name_another_login_or_its_worker(login: Login, conn: DictConnection) -> None:
    first, first_url = login(roles.RELAY)
    _, second_url = login(roles.RELAY)
    with _as(first_url) as relay:
        relay.execute("INSERT INTO outbox_relay_workers (worker, table_name) VALUES ('relay-a', 'outbox_events')")
        relay.execute("INSERT INTO outbox_audit (outbox_table, code, worker) VALUES ('outbox_events', 'x', 'relay-a')")
    with _as(second_url) as other:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="relay-a' belongs to another login"):
            other.execute(
                "INSERT INTO outbox_audit (outbox_table, code, worker, detail) "
                "VALUES ('outbox_events', 'outbox_replay', 'relay-a', 'replayed by alice')"
            )
        for column, value in (("login", first), ("created_at", "2000-01-01"), ("xact", "1")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                other.execute(
                    sql.SQL(
                        "INSERT INTO outbox_audit (outbox_table, code, {}) VALUES ('outbox_events', 'x', %s)"
                    ).format(sql.Identifier(column)),
                    (value,),
                )
        other.execute("UPDATE outbox_relay_workers SET heartbeat_at = now() WHERE worker = 'relay-a'")
    # A login that may write the column (a grant made by hand) is refused by the database all the same.
    conn.execute("GRANT INSERT ON outbox_audit TO outbox_relay")
    with _as(second_url) as other, pytest.raises(psycopg.errors.InsufficientPrivilege, match="database's to write"):
        other.execute(
            "INSERT INTO outbox_audit (outbox_table, code, login) VALUES ('outbox_events', 'x', %s)", (first,)
        )
    [written] = conn.execute("SELECT login FROM outbox_audit").fetchall()
    assert written["login"] == first
    assert conn.execute("SELECT login FROM outbox_relay_workers").fetchone()["login"] == first


def test_a_producer_chooses_no_id_reads_no_key_or_state_and_its_message_keeps_its_place(
    login: Login, conn: DictConnection
) -> None:
    _, url = login(roles.PRODUCER)
    first = Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={}, ordering_key="a"), outside_transaction=True)
    with _as(url) as producer:
        for statement in (
            "INSERT INTO outbox_events (id, event_id, topic, payload, payload_sha) OVERRIDING SYSTEM VALUE "
            "VALUES (0, 'low', 't', '{}', 's')",  # lower than every id the sequence gives
            "INSERT INTO outbox_events (event_id, topic, payload, payload_sha, ordering_key, ordering_blocked) "
            "VALUES ('jump', 't', '{}', 's', 'a', false)",
            "SELECT ordering_key FROM outbox_events",
            "SELECT status FROM outbox_events",
            "SELECT ordering_skipped_at FROM outbox_events",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                producer.execute(statement)
        producer.execute(
            "INSERT INTO outbox_events (event_id, topic, payload, payload_sha, ordering_key) "
            "VALUES ('by-sql', 't', '{}', 's', 'a')"
        )
        second = Outbox(EVENTS).enqueue(
            producer, Message(topic="t", payload={}, ordering_key="a"), outside_transaction=True
        )
        many = Outbox(EVENTS).enqueue_many(
            producer, [Message(topic="t", payload={"n": i}) for i in range(COPY_MIN_ROWS)], outside_transaction=True
        )
    assert len(many) == COPY_MIN_ROWS and all(not r.duplicate for r in many)  # by INSERT: COPY writes ids
    waiting = conn.execute(
        "SELECT event_id, id, ordering_blocked FROM outbox_events WHERE ordering_key = 'a' ORDER BY id"
    ).fetchall()
    assert [r["ordering_blocked"] for r in waiting] == [False, True, True]
    assert waiting[0]["id"] == first.id and waiting[2]["id"] == second.id
    # Even the owner's INSERT cannot put a keyed message beside its key's head.
    conn.execute(
        "INSERT INTO outbox_events (event_id, topic, payload, payload_sha, ordering_key, ordering_blocked) "
        "VALUES ('owner', 't', '{}', 's', 'a', false)"
    )
    assert conn.execute("SELECT ordering_blocked FROM outbox_events WHERE event_id = 'owner'").fetchone()[
        "ordering_blocked"
    ]


def _hold_every_stripe(holder: psycopg.Connection[DictRow]) -> None:
    holder.execute(
        "SELECT count(pg_advisory_lock(outbox_ordering_lock_space(%s), s)) FROM generate_series(0, 511) AS s",
        (EVENTS,),
    )


def test_a_login_without_grants_holding_every_stripe_stalls_no_commit_and_is_named(
    login: Login, conn: DictConnection, db_url: str
) -> None:
    _, producer_url = login(roles.PRODUCER)
    _, nobody_url = login(None, application_name="stripe-holder")
    _, relay_url = login(roles.RELAY)
    outbox = Outbox(EVENTS)
    with _as(nobody_url) as holder:
        _hold_every_stripe(holder)
        holder_pid = holder.info.backend_pid
        with psycopg.connect(producer_url) as producer:
            producer.execute("SET lock_timeout = '2s'")  # what waited forever failed here with LockNotAvailable
            a1 = outbox.enqueue(producer, Message(topic="t", payload={"n": 1}, ordering_key="a"))
            producer.commit()
            a2 = outbox.enqueue(producer, Message(topic="t", payload={"n": 2}, ordering_key="a"))
            producer.commit()
        blocked = conn.execute("SELECT id FROM outbox_events WHERE ordering_blocked").fetchall()
        assert [r["id"] for r in blocked] == [a2.id]
        status = read_status(OutboxTable(conn, EVENTS))
        [held] = status.lock_holders
        assert held["pid"] == holder_pid and held["stripes"] == 512 and held["outside_transaction"]
        [check] = [c for c in evaluate_checks(status, CheckThresholds()) if c.name == "blocked_keys"]
        assert (
            check.severity == "warn"
            and f"pid {holder_pid}" in check.description
            and "'stripe-holder'" in check.description
        )
        assert "pg_advisory_lock" not in check.description  # never what the session runs
        # The relay delivers a1; releasing its key needs the stripe, which the holder keeps: a2 waits.
        delivered: list[int] = []
        destination = ScriptedDestination(lambda msg: delivered.append(msg.id) or Outcome.sent())
        Relay(relay_url, table_settings(EVENTS), destination).run(once=True)
        assert delivered == [a1.id]
        assert [r["id"] for r in conn.execute("SELECT id FROM outbox_events WHERE ordering_blocked")] == [a2.id]
    # Let go: the next sweep releases the key, and a2 goes, after a1.
    assert read_status(OutboxTable(conn, EVENTS)).lock_holders == []
    assert maintenance.requeue_stuck(db_url, table_settings(EVENTS)).keys_released == 1
    Relay(relay_url, table_settings(EVENTS), destination).run(once=True)
    assert delivered == [a1.id, a2.id]


def test_a_commit_that_finds_its_stripe_held_still_lets_a_free_key_go(
    login: Login, conn: DictConnection, db_url: str
) -> None:
    _, nobody_url = login(None)
    outbox = Outbox(EVENTS)
    a1 = outbox.enqueue(conn, Message(topic="t", payload={}, ordering_key="a"), outside_transaction=True)
    table = OutboxTable(conn, EVENTS)
    [claimed] = table.claim("w", 10, 30)
    with _as(nobody_url) as holder, psycopg.connect(db_url) as writer:
        _hold_every_stripe(holder)
        writer.execute("SET lock_timeout = '2s'")  # what waited forever failed here with LockNotAvailable
        a2 = outbox.enqueue(writer, Message(topic="t", payload={}, ordering_key="a"))  # waits behind a1
        table.settle("w", [Settlement(claimed.id, claimed.attempts, "sent", m.AUDIT_SUCCESS, ref="ok")])
        writer.commit()  # its stripe held: no lock, and a1 is delivered, so a2 goes
    assert (
        conn.execute("SELECT ordering_blocked FROM outbox_events WHERE id = %s", (a2.id,)).fetchone()[
            "ordering_blocked"
        ]
        is False
    )
    assert [msg.id for msg in table.claim("w", 10, 30)] == [a2.id] and a1.id == claimed.id
    ordering.release_contended(table)
