"""Ordered delivery per key: one message of a key in flight at a time, in enqueue order; a dead head
holds only its own key, visibly, until it is replayed or skipped (issue 24)."""

import json
from collections import defaultdict

import psycopg
import pytest

from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.errors import InvalidMessage
from outbox_pipelines.core.models import Message, Outcome
from outbox_pipelines.core.oncall.health import evaluate_checks, read_status
from outbox_pipelines.core.operations import maintenance
from outbox_pipelines.core.operations.replay import ReplayFilter, replay_dead
from outbox_pipelines.core.relay import Relay, ordering
from outbox_pipelines.core.settings import CheckThresholds
from outbox_pipelines.core.storage.table import OutboxTable, Settlement
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, rows, statuses
from outbox_pipelines_tests.rows import expire_leases

EVENTS = "outbox_events"


def settings(**overrides):
    return table_settings(EVENTS, **{"mode": "competing", "idle_sleep_s": 0.01, "batch_size": 50, **overrides})


def enqueue(conn, *keyed: tuple[str | None, str]) -> list[int]:
    """Enqueue (ordering_key, name) pairs one by one, each in its own transaction; the row ids."""
    outbox = Outbox(EVENTS)
    return [
        outbox.enqueue(
            conn, Message(topic="t", payload={"name": name}, event_id=name, ordering_key=key), outside_transaction=True
        ).id
        for key, name in keyed
    ]


def names(messages) -> list[str]:
    return [msg.payload["name"] for msg in messages]


def by_key(messages) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for msg in messages:
        out[msg.ordering_key or ""].append(msg.payload["name"])
    return dict(out)


def blocked(conn) -> list[str]:
    return sorted(r["event_id"] for r in rows(conn, EVENTS, "ordering_blocked"))


def test_a_key_s_later_messages_wait_and_unkeyed_ones_do_not(conn):
    enqueue(conn, ("a", "a1"), ("a", "a2"), ("b", "b1"), (None, "u1"), ("a", "a3"))
    many = Outbox(EVENTS).enqueue_many(
        conn,
        [
            Message(topic="t", payload={"name": n}, event_id=n, ordering_key=k)
            for k, n in [("c", "c1"), ("c", "c2"), ("b", "b2"), (None, "u2")]
        ],
        outside_transaction=True,
    )
    assert len(many) == 4
    assert blocked(conn) == ["a2", "a3", "b2", "c2"]
    stored = {r["event_id"]: r["ordering_key"] for r in rows(conn, EVENTS)}
    assert stored["a1"] == "a" and stored["u1"] is None and stored["u2"] is None


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there"])
def test_an_unusable_ordering_key_is_refused_and_nothing_is_written(conn, key):
    with pytest.raises(InvalidMessage, match="ordering_key"):
        Outbox(EVENTS).enqueue(conn, Message(topic="t", payload={}, ordering_key=key), outside_transaction=True)
    assert rows(conn, EVENTS) == []


def test_the_claim_takes_one_head_per_key_before_its_limit(conn):
    # 30 messages of one busy key first, then 3 other keys: the busy key must not fill the batch
    enqueue(conn, *[("busy", f"busy{i}") for i in range(30)], ("k1", "k1a"), ("k1", "k1b"), ("k2", "k2a"), (None, "u1"))
    claimed = OutboxTable(conn, EVENTS).claim("w", 4, 30)
    assert sorted(names(claimed)) == ["busy0", "k1a", "k2a", "u1"]
    # while a key's head is in flight, nothing more of that key is claimed
    again = OutboxTable(conn, EVENTS).claim("w2", 10, 30)
    assert names(again) == []


def test_a_relay_delivers_each_key_in_order_through_retries(db_url, conn):
    keyed = [(k, f"{k}{i}") for i in range(1, 6) for k in ("a", "b", "c")]
    enqueue(conn, *keyed, (None, "u1"), (None, "u2"))
    failed_once: set[str] = set()

    def decide(msg):
        if msg.payload["name"] in ("a2", "b4") and msg.payload["name"] not in failed_once:
            failed_once.add(msg.payload["name"])
            return Outcome.retry(m.BROKER_5XX, "HTTP 503", delay_s=0.0)
        return Outcome.sent(ref=f"ok-{msg.id}")

    scripted = ScriptedDestination(decide)
    Relay(db_url, settings(), scripted).run(max_seconds=20, max_entries=len(keyed) + 2 + 2)
    assert statuses(conn, EVENTS) == {"sent": 17}
    got = by_key(scripted.calls)
    assert got["a"] == ["a1", "a2", "a2", "a3", "a4", "a5"]
    assert got["b"] == ["b1", "b2", "b3", "b4", "b4", "b5"]
    assert got["c"] == ["c1", "c2", "c3", "c4", "c5"]


def test_a_dead_head_parks_only_its_key_visibly_until_replayed(db_url, conn):
    enqueue(conn, ("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("b", "b2"))
    reject = ScriptedDestination(
        lambda msg: Outcome.dead(m.BAD_REQUEST, "HTTP 400") if msg.payload["name"] == "a1" else Outcome.sent(ref="ok")
    )
    Relay(db_url, settings(), reject).run(max_seconds=10, max_entries=3)
    assert {r["event_id"]: r["status"] for r in rows(conn, EVENTS)} == {
        "a1": "dead",
        "a2": "pending",
        "a3": "pending",
        "b1": "sent",
        "b2": "sent",
    }
    status = read_status(OutboxTable(conn, EVENTS), stuck_after_s=600, window_s=3600)
    assert (status.blocked_keys, status.blocked_messages) == (1, 2)
    assert status.blocked_oldest[0]["key"] == "a" and status.blocked_since is not None
    check = {v.name: v for v in evaluate_checks(status, CheckThresholds())}["blocked_keys"]
    assert check.severity == "warn" and "key a: id " in check.description and "replay" in check.description
    # a relay that runs on leaves the parked key alone
    assert Relay(db_url, settings(), reject).run(once=True).claimed == 0

    replay_dead(db_url, EVENTS, ReplayFilter(ids=(rows(conn, EVENTS, "event_id = 'a1'")[0]["id"],)), force=True)
    fixed = ScriptedDestination()
    Relay(db_url, settings(), fixed).run(max_seconds=10, max_entries=3)
    assert names(fixed.calls) == ["a1", "a2", "a3"] and statuses(conn, EVENTS) == {"sent": 5}
    assert read_status(OutboxTable(conn, EVENTS), stuck_after_s=600, window_s=3600).blocked_keys == 0


def test_under_the_skip_policy_a_dead_head_is_passed_over_and_stays_replayable(db_url, conn):
    enqueue(conn, ("a", "a1"), ("a", "a2"), ("a", "a3"))
    reject = ScriptedDestination(
        lambda msg: Outcome.dead(m.BAD_REQUEST, "HTTP 400") if msg.payload["name"] == "a1" else Outcome.sent(ref="ok")
    )
    Relay(db_url, settings(ordering="skip"), reject).run(max_seconds=10, max_entries=3)
    assert names(reject.calls) == ["a1", "a2", "a3"]
    dead = rows(conn, EVENTS, "status = 'dead'")
    assert [r["event_id"] for r in dead] == ["a1"] and dead[0]["ordering_skipped_at"] is not None
    assert read_status(OutboxTable(conn, EVENTS), stuck_after_s=600, window_s=3600).blocked_keys == 0


def test_an_operator_skips_a_parked_head_from_the_cli(db_url, conn, cli_env):
    [a1, *_] = enqueue(conn, ("a", "a1"), ("a", "a2"))
    Relay(db_url, settings(), ScriptedDestination(lambda msg: Outcome.dead(m.BAD_REQUEST, "HTTP 400"))).run(
        max_seconds=5, max_entries=1
    )
    status = run_cli(cli_env, "status", "--table", EVENTS)
    assert "blocked" in status.stdout and f"skip --table {EVENTS} --id {a1}" in status.stdout, status.stdout
    as_json = json.loads(run_cli(cli_env, "status", "--table", EVENTS, "--json").stdout)
    assert [t["blocked_keys"] for t in as_json if t["table"] == EVENTS] == [1]

    dry = run_cli(cli_env, "skip", "--table", EVENTS, "--key", "a", "--dry-run")
    assert dry.returncode == 0 and str(a1) in dry.stdout and "dry run" in dry.stdout.lower(), dry
    assert blocked(conn) == ["a2"]
    real = run_cli(cli_env, "skip", "--table", EVENTS, "--id", str(a1), "--reason", "bad payload, fixed by hand")
    assert real.returncode == 0, real.stderr
    assert blocked(conn) == [] and "outbox_skip" in audit_codes(conn, EVENTS, a1)
    nothing = run_cli(cli_env, "skip", "--table", EVENTS)
    assert nothing.returncode == 2 and "--id" in nothing.stderr


def test_a_writer_committing_after_the_settle_releases_its_own_message(db_url, conn):
    """The settle's release cannot see a message whose writer has not committed: the writer's commit
    re-checks and lets it go itself."""
    enqueue(conn, ("a", "a1"))
    table = OutboxTable(conn, EVENTS)
    [a1] = table.claim("w", 10, 30)
    with psycopg.connect(db_url) as writer:
        Outbox(EVENTS).enqueue(writer, Message(topic="t", payload={"name": "a2"}, event_id="a2", ordering_key="a"))
        assert table.settle("w", [Settlement(a1.id, a1.attempts, "sent", m.AUDIT_SUCCESS, ref="ok")]) == {a1.id}
        writer.commit()
    assert blocked(conn) == []
    assert names(table.claim("w", 10, 30)) == ["a2"]


def test_a_settle_that_meets_a_committing_writer_hands_the_key_back_for_later(db_url, conn):
    enqueue(conn, ("a", "a1"), ("a", "a2"))
    table = OutboxTable(conn, EVENTS)
    [a1] = table.claim("w", 10, 30)
    with psycopg.connect(db_url) as writer:  # stands in for a writer inside its commit-time check
        writer.execute(
            "SELECT pg_advisory_xact_lock_shared(outbox_ordering_lock_space(%s), outbox_ordering_stripe('a'))",
            (EVENTS,),
        )
        table.settle("w", [Settlement(a1.id, a1.attempts, "sent", m.AUDIT_SUCCESS, ref="ok")])
        assert table.contended_keys == {"a"} and blocked(conn) == ["a2"]
        assert table.release_contended() == ["a"]  # still held: kept for later
    assert ordering.release_contended(table) == [] and blocked(conn) == []


def test_a_relay_in_the_middle_of_a_drain_tries_once_and_carries_a_held_key_to_its_next_batch(db_url, conn):
    """Mid-drain the relay never sleeps on a held key (another relay's settle holds most of them and has
    committed by the next batch); going idle, it waits for the holder as before."""
    enqueue(conn, ("a", "a1"), ("a", "a2"))
    table = OutboxTable(conn, EVENTS)
    [a1] = table.claim("w", 10, 30)
    naps: list[float] = []
    with psycopg.connect(db_url) as holder:
        holder.execute(
            "SELECT pg_advisory_xact_lock_shared(outbox_ordering_lock_space(%s), outbox_ordering_stripe('a'))",
            (EVENTS,),
        )
        table.settle("w", [Settlement(a1.id, a1.attempts, "sent", m.AUDIT_SUCCESS, ref="ok")])
        assert ordering.release_contended(table, patient=False, sleep=naps.append) == ["a"]
        assert naps == [] and table.contended_keys == {"a"} and blocked(conn) == ["a2"]
        assert ordering.release_contended(table, patient=True, sleep=naps.append) == ["a"]  # held throughout
        assert len(naps) >= 2
    assert ordering.release_contended(table, patient=False, sleep=naps.append) == [] and blocked(conn) == []


def test_a_transaction_writing_many_waiting_keys_commits_within_the_lock_table(db_url, conn):
    """Every key of a big batch has its second message wait behind its first, just before it: the batch's commit
    takes one lock per stripe, not one per key (which ran out of shared memory at ~20,000 keys)."""
    keys = 30_000
    with conn.transaction():
        Outbox(EVENTS).enqueue_many(
            conn,
            [
                Message(topic="t", payload={}, event_id=f"{which}-{k}", ordering_key=f"k{k}")
                for k in range(keys)
                for which in ("first", "next")
            ],
            outside_transaction=True,
        )
    waiting = conn.execute("SELECT count(*) AS n FROM outbox_events WHERE ordering_blocked").fetchone()["n"]
    assert waiting == keys


def test_the_sweep_releases_a_key_nobody_released(db_url, conn):
    enqueue(conn, ("a", "a1"), ("a", "a2"))
    conn.execute("DELETE FROM outbox_events WHERE event_id = 'a1'")  # e.g. removed by hand
    assert blocked(conn) == ["a2"]
    report = maintenance.requeue_stuck(db_url, table_settings(EVENTS))
    assert blocked(conn) == [] and report.keys_released == 1


def test_an_expired_lease_is_re_taken_before_anything_else_of_its_key(conn):
    enqueue(conn, ("a", "a1"), ("a", "a2"))
    table = OutboxTable(conn, EVENTS)
    assert names(table.claim("old", 10, 30)) == ["a1"]
    expire_leases(conn, EVENTS, event_ids=["a1"])
    assert names(table.claim("new", 10, 30)) == ["a1"]  # the same head again, never a2 beside it
    assert names(table.claim("third", 10, 30)) == []
