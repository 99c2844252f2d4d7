"""The per-table claim and audit settings: claim = "transaction" (rows locked in one transaction
from claim to settle) and audit = "failures" (deliveries leave no audit row)."""

import subprocess

import pytest

from outbox_pipelines import Outcome, RetryPolicy
from outbox_pipelines.core import models as m
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, enqueue_n, rows, statuses
from outbox_pipelines_tests.processes import kill_process, start_relay, stop_and_read, wait_until
from outbox_pipelines_tests.rows import make_due
from outbox_pipelines_tests.scratch import DEMO_PARTS

ORDERS = "outbox_orders"


def audit_rows(conn, message_id):
    return conn.execute(
        "SELECT code, from_status, to_status, attempts, worker FROM outbox_audit "
        "WHERE outbox_table = %s AND message_id = %s ORDER BY id",
        (EVENTS, message_id),
    ).fetchall()


def test_a_transaction_claim_settles_sent_retry_and_dead_as_a_lease_does(db_url, conn):
    ok, flaky, poison = enqueue_n(conn, EVENTS, 3)
    settings = events_settings(claim="transaction", retry=RetryPolicy(base_s=60, max_s=60, max_attempts=2, jitter=0))
    outcomes = {
        ok: Outcome.sent(ref="r-1"),
        flaky: Outcome.retry(m.BROKER_5XX, "HTTP 503"),
        poison: Outcome.dead(m.BAD_REQUEST, "HTTP 400"),
    }
    destination = ScriptedDestination(lambda msg: outcomes[msg.id])
    report = Relay(db_url, settings, destination, worker_id="relay-a").run(once=True)
    assert (report.sent, report.retried, report.dead) == (1, 1, 1)
    by_id = {r["id"]: r for r in rows(conn, EVENTS)}
    assert (by_id[ok]["status"], by_id[ok]["attempts"], by_id[ok]["result_ref"]) == ("sent", 1, "r-1")
    assert (by_id[flaky]["status"], by_id[flaky]["attempts"], by_id[flaky]["last_error_code"]) == (
        "pending",
        1,
        m.BROKER_5XX,
    )
    assert (by_id[poison]["status"], by_id[poison]["attempts"]) == ("dead", 1)
    # The rows were never 'sending': the audit tells pending -> outcome, by this worker, at attempt 1.
    assert audit_rows(conn, ok) == [
        {
            "code": "outbox_flush_success",
            "from_status": "pending",
            "to_status": "sent",
            "attempts": 1,
            "worker": "relay-a",
        }
    ]
    assert [r["code"] for r in audit_rows(conn, flaky)] == ["outbox_flush_retry"]
    # The second attempt is the last one: dead, with the attempts counted.
    make_due(conn, EVENTS, flaky)
    Relay(db_url, settings, destination).run(once=True)
    assert rows(conn, EVENTS, f"id = {flaky}")[0]["status"] == "dead"
    assert rows(conn, EVENTS, f"id = {flaky}")[0]["attempts"] == 2


def test_a_transaction_claim_deletes_on_success_and_gives_back_a_throttled_attempt(db_url, conn):
    sent, throttled = enqueue_n(conn, EVENTS, 2)
    destination = ScriptedDestination(
        lambda msg: Outcome.sent() if msg.id == sent else Outcome.retry(m.RATE_LIMITED, "HTTP 429", delay_s=30)
    )
    Relay(db_url, events_settings(claim="transaction", on_success="delete"), destination).run(once=True)
    left = rows(conn, EVENTS)
    assert [(r["id"], r["status"], r["attempts"]) for r in left] == [(throttled, "pending", 0)]
    assert audit_codes(conn, EVENTS, sent) == ["outbox_flush_success"]


def test_audit_failures_keeps_retries_and_deaths_but_not_claims_or_deliveries(db_url, conn):
    ok, flaky = enqueue_n(conn, EVENTS, 2)
    destination = ScriptedDestination(
        lambda msg: Outcome.sent() if msg.id == ok else Outcome.retry(m.BROKER_5XX, "HTTP 503")
    )
    for claim in ("lease", "transaction"):
        conn.execute("UPDATE outbox_events SET status = 'pending', available_at = now(), attempts = 0")
        conn.execute("TRUNCATE outbox_audit")
        Relay(db_url, events_settings(claim=claim, audit="failures"), destination).run(once=True)
        assert audit_codes(conn, EVENTS, ok) == [], claim
        assert audit_codes(conn, EVENTS, flaky) == ["outbox_flush_retry"], claim
        sent_row = rows(conn, EVENTS, f"id = {ok}")[0]
        assert sent_row["status"] == "sent" and sent_row["published_at"] is not None  # when it went is on the row


def test_the_default_audit_answers_when_claimed_by_whom_and_how_it_ended_in_one_row_per_attempt(db_url, conn):
    """claim = "auto" (the default) writes a batch delivered within `hold` once: its one audit row per
    attempt carries when it was claimed, by which worker, the outcome and when it was settled."""
    [row_id] = enqueue_n(conn, EVENTS, 1)
    Relay(db_url, events_settings(), ScriptedDestination(), worker_id="w-1").run(once=True)
    assert audit_codes(conn, EVENTS, row_id) == ["outbox_flush_success"]
    [audit] = conn.execute("SELECT * FROM outbox_audit WHERE message_id = %s", (row_id,)).fetchall()
    [row] = rows(conn, EVENTS, f"id = {row_id}")
    assert (audit["worker"], audit["from_status"], audit["to_status"], audit["attempts"]) == (
        "w-1",
        "pending",
        "sent",
        1,
    )
    assert audit["claimed_at"] is not None and audit["claimed_at"] <= audit["created_at"]
    assert row["published_at"] >= audit["claimed_at"]


def test_the_lease_claim_audits_the_claim_and_the_delivery(db_url, conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    Relay(db_url, events_settings(claim="lease"), ScriptedDestination()).run(once=True)
    assert audit_codes(conn, EVENTS, row_id) == ["outbox_claim", "outbox_flush_success"]
    claimed = conn.execute("SELECT claimed_at FROM outbox_audit WHERE message_id = %s", (row_id,)).fetchall()
    assert len({r["claimed_at"] for r in claimed}) == 1 and claimed[0]["claimed_at"] is not None


def test_claim_and_audit_settings_are_checked(tmp_path):
    config = tmp_path / "outbox.toml"
    config.write_text(DEMO_PARTS + '[tables.outbox_orders]\nclaim = "transaction"\naudit = "failures"\n')
    orders = load_settings(env={"OUTBOX_CONFIG": str(config)}).table(ORDERS)
    assert (orders.claim, orders.audit) == ("transaction", "failures")
    assert load_settings(env={}).table(ORDERS).claim == "auto"
    config.write_text(DEMO_PARTS + '[tables.outbox_orders]\nclaim = "locked"\n')
    with pytest.raises(ConfigError, match="claim must be one of auto, lease, transaction, got 'locked'"):
        load_settings(env={"OUTBOX_CONFIG": str(config)}).table(ORDERS)


# -- real relay processes ---------------------------------------------------------------------


def _transaction_relay(cli_env, tmp_path, sink_url: str, lease: str = "60s", *args: str) -> subprocess.Popen:
    config = tmp_path / "outbox.toml"
    config.write_text(
        DEMO_PARTS + f'[tables.outbox_orders]\nclaim = "transaction"\nmode = "competing"\nlease = "{lease}"\n'
    )
    env = {**cli_env, "OUTBOX_CONFIG": str(config), "OUTBOX_BROKER_URL": sink_url, "OUTBOX_BATCH_SIZE": "10"}
    return start_relay(env, ORDERS, *args)


@pytest.mark.slow
def test_a_transaction_relay_killed_mid_batch_frees_its_rows_at_once(cli_env, tmp_path, conn, http_sink):
    enqueue_n(conn, ORDERS, 30, prefix="order-")
    http_sink.delay_s = 5.0
    proc = _transaction_relay(cli_env, tmp_path, http_sink.url)
    try:
        wait_until(lambda: len(http_sink.received) >= 10, 30, "the relay to be mid-batch", 0.05)
    finally:
        kill_process(proc)
    # No lease to wait out: the dead session's transaction is gone, its rows are pending as they were.
    wait_until(lambda: statuses(conn, ORDERS) == {"pending": 30}, 30, "the rows to be free", 0.05)
    assert {r["attempts"] for r in rows(conn, ORDERS)} == {0}
    http_sink.delay_s = 0.0
    again = _transaction_relay(cli_env, tmp_path, http_sink.url, "60s", "--once")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert statuses(conn, ORDERS) == {"sent": 30}
    reached_twice = [key for key, n in http_sink.counts.items() if n == 2]
    assert len(reached_twice) == 10 and set(http_sink.counts.values()) == {1, 2}  # at least once, same key


def test_a_transaction_relay_that_hangs_past_its_lease_is_cut_off_by_the_server(cli_env, tmp_path, conn, http_sink):
    enqueue_n(conn, ORDERS, 5, prefix="order-")
    http_sink.delay_s = 4.0  # longer than the lease: the server ends the idle transaction
    proc = _transaction_relay(cli_env, tmp_path, http_sink.url, "1s")
    try:
        wait_until(lambda: len(http_sink.received) >= 5, 30, "the first delivery", 0.05)
        # While the relay still waits for its answers, the rows are free again for anyone.
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) AS n FROM outbox_orders WHERE status = 'pending' "
                    "AND id NOT IN (SELECT id FROM outbox_orders FOR UPDATE SKIP LOCKED)"
                ).fetchone()["n"]
                == 0
            ),
            3.5,
            "the server to end the hung transaction",
            0.05,
        )
        http_sink.delay_s = 0.0
        wait_until(lambda: statuses(conn, ORDERS) == {"sent": 5}, 60, "the relay to reconnect and deliver", 0.05)
    finally:
        _, out, err = stop_and_read(proc)
    assert "database error" in err  # said, not hidden
    assert set(http_sink.counts.values()) <= {1, 2, 3}


def test_a_fast_commit_claim_leaves_the_session_durable(db_url, conn):
    from outbox_pipelines.core.storage.db import connect
    from outbox_pipelines.core.storage.table import OutboxTable

    enqueue_n(conn, EVENTS, 2)
    with connect(db_url) as relay_conn:  # autocommit, as the relay's session
        assert len(OutboxTable(relay_conn, EVENTS).claim("w", 1, 60, fast_commit=True)) == 1
        # The setting lived for the claim's own transaction only: the next statement waits for its flush.
        assert relay_conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"
    with connect(db_url) as caller:
        with caller.transaction():
            OutboxTable(caller, EVENTS).claim("w", 1, 60)
            assert caller.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"
    assert statuses(conn, EVENTS) == {"sending": 2}


def test_a_fast_commit_settle_skips_the_flush_of_its_own_transaction_only(db_url, conn):
    from outbox_pipelines.core.storage.db import connect
    from outbox_pipelines.core.storage.table import OutboxTable

    enqueue_n(conn, EVENTS, 2)
    with connect(db_url, autocommit=False) as caller:  # a transaction to look inside
        table = OutboxTable(caller, EVENTS)
        (claimed,) = table.claim("w", 1, 60)
        table.settle_sent("w", [claimed.id], [claimed.attempts], audit_code=m.AUDIT_SUCCESS, fast_commit=True)
        assert caller.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "off"
        caller.rollback()
    with connect(db_url) as relay_conn:  # autocommit, as the relay's session
        table = OutboxTable(relay_conn, EVENTS)
        claimed = table.claim("w", 2, 60)
        settled = table.settle_sent(
            "w", [c.id for c in claimed], [c.attempts for c in claimed], audit_code=m.AUDIT_SUCCESS, fast_commit=True
        )
        assert settled == {c.id for c in claimed}
        assert relay_conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"
    assert statuses(conn, EVENTS) == {"sent": 2}
    assert audit_codes(conn, EVENTS).count(m.AUDIT_SUCCESS) == 2


@pytest.mark.parametrize("claim_mode", ["lease", "transaction", "auto"])
def test_held_batches_and_a_leased_batch_that_empties_the_queue_settle_without_waiting_for_the_flush(
    db_url, conn, monkeypatch, claim_mode
):
    from outbox_pipelines.core.storage.table import OutboxTable

    settles: list[tuple[int, bool, str]] = []
    settle_sent = OutboxTable.settle_sent

    def noting(self, worker, ids, attempts, **options):
        settled = settle_sent(self, worker, ids, attempts, **options)
        commit_mode = self.conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"]
        settles.append((len(ids), options.get("fast_commit", False), commit_mode))
        return settled

    monkeypatch.setattr(OutboxTable, "settle_sent", noting)
    enqueue_n(conn, EVENTS, 5)
    settings = events_settings(batch_size=2, claim=claim_mode)
    report = Relay(db_url, settings, ScriptedDestination(lambda msg: Outcome.sent())).run(once=True)
    assert report.sent == 5 and statuses(conn, EVENTS) == {"sent": 5}
    # Held rows commit in the relay's own transaction, which wrote nothing else: a database crash that loses
    # that commit puts them back to be sent again. Full leased batches drain a backlog and share one flush;
    # the last one emptied the queue. The setting is the settle's transaction's own (the last leased batch's
    # autocommit settle is over when it is read: "on" again).
    if claim_mode == "lease":
        assert settles == [(2, False, "on"), (2, False, "on"), (1, True, "on")]
    else:
        assert settles == [(2, True, "off"), (2, True, "off"), (1, True, "off")]


# -- the claim reads the destination's gate itself -------------------------------------------------
@pytest.mark.parametrize(
    "state",
    [
        "paused_until = now() + interval '1 minute', pause_reason = '429'",
        "paused_until = now() - interval '1 second', pause_reason = '429'",  # over, but a probe goes first
        "circuit_opened_at = now(), next_probe_at = now() + interval '10 seconds'",
    ],
)
@pytest.mark.parametrize("claim_mode", ["lease", "transaction"])
def test_a_gated_claim_takes_nothing_unless_the_destination_is_plainly_open(conn, state, claim_mode):
    from outbox_pipelines.core.storage.table import OutboxTable

    enqueue_n(conn, EVENTS, 3)
    table = OutboxTable(conn, EVENTS)

    def claim(gated):
        if claim_mode == "transaction":
            with conn.transaction():
                return table.claim_held(10, 30.0, gated=gated)
        return table.claim("w", 10, 30.0, gated=gated)

    conn.execute("INSERT INTO outbox_destination_health (table_name) VALUES (%s)", (EVENTS,))
    conn.execute(f"UPDATE outbox_destination_health SET {state} WHERE table_name = %s", (EVENTS,))
    assert claim(gated=True) == []
    assert statuses(conn, EVENTS) == {"pending": 3}
    assert len(claim(gated=False)) == 3  # what a probe does, past the gate
    conn.execute(
        "UPDATE outbox_destination_health SET paused_until = NULL, pause_reason = NULL, "
        "circuit_opened_at = NULL WHERE table_name = %s",
        (EVENTS,),
    )
    enqueue_n(conn, EVENTS, 2, prefix="later-")
    # Open again: the gated claim takes what is pending (under a lease, the 3 are being sent).
    assert len(claim(gated=True)) == (2 if claim_mode == "lease" else 5)
