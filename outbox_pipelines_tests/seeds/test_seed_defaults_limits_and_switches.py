"""Seed requirements that had no test of their own (docs/seeds.md, "Gaps").

Each test proves one row of the traceability matrix: a default value the seeds
name, a metric, what logs and last_error may hold, the statement-timeout audit
code, a table constraint, the relay / cleaner switches, the settings variables
of seed 004 and the default relay mode. Time moves in the database
(``available_at = now()``), never by sleeping.
"""

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta

import psycopg
import pytest

from outbox_pipelines import HandlerRegistry, Message, Outbox, PermanentError
from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations import HandlerDestination, HttpDestination
from outbox_pipelines.core.models import ERROR_TEXT_LIMIT, Outcome
from outbox_pipelines.core.relay import Relay, run_table_relay
from outbox_pipelines.core.relay import session as relay_session
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines.core.settings import GlobalSettings, TableSettings, load_settings
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines.orders.api.app import ApiSettings
from outbox_pipelines.orders.api.ratelimit import RateLimiter
from outbox_pipelines_tests.api.conftest import broker_settings, sample
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, audit_codes, enqueue_n, rows, statuses
from outbox_pipelines_tests.rows import expire_leases, make_due, make_sent
from outbox_pipelines_tests.scratch import DEMO_PARTS

ORDERS = "outbox_orders"
EVENTS = "outbox_events"


# -- seed 000 §2 / §9: the orders preset gives up at attempt 8 (OUTBOX_RETRY_MAX default 8) ----------------
def test_an_order_failing_with_5xx_every_time_is_dead_exactly_at_attempt_8_by_default(db_url, conn):
    shipped = load_settings(env={}, path=None).table(ORDERS)  # no OUTBOX_RETRY_MAX, no config file
    assert shipped.retry.max_attempts == 8
    assert load_settings(env={"OUTBOX_RETRY_MAX": ""}, path=None).table(ORDERS).retry.max_attempts == 8
    # The circuit breaker would give failures back while open (plan_settlement): keep it shut for this test.
    settings = replace(shipped, circuit_threshold=1000, idle_sleep_s=0.01)
    [row_id] = enqueue_n(conn, ORDERS, 1)
    destination = ScriptedDestination(lambda msg: Outcome.retry(m.BROKER_5XX, "HTTP 503: 'broker restarting'"))

    for attempt in range(1, 8):
        make_due(conn, ORDERS)
        report = Relay(db_url, settings, destination).run(once=True)
        assert (report.claimed, report.retried, report.dead) == (1, 1, 0), attempt
        row = rows(conn, ORDERS)[0]
        assert (row["status"], row["attempts"], row["last_error_code"]) == ("pending", attempt, m.BROKER_5XX)

    make_due(conn, ORDERS)
    report = Relay(db_url, settings, destination).run(once=True)
    assert (report.claimed, report.retried, report.dead) == (1, 0, 1)
    row = rows(conn, ORDERS)[0]
    assert (row["status"], row["attempts"], row["last_error_code"]) == ("dead", 8, m.BROKER_5XX)
    assert row["last_error"].startswith("gave up after 8 of 8 attempts")
    assert len(destination.calls) == 8
    # One audit row per attempt (claim = "auto": each attempt was delivered within `hold`).
    assert audit_codes(conn, ORDERS, row_id) == ["outbox_flush_retry"] * 7 + ["outbox_flush_dead"]
    make_due(conn, ORDERS)
    assert Relay(db_url, settings, destination).run(once=True).claimed == 0


# -- seed 001 §4: 60 requests a minute per client by default ---------------------------------------------
def test_the_order_api_allows_60_requests_a_minute_per_client_by_default(monkeypatch):
    for name in [n for n in os.environ if n.startswith("OUTBOX_")]:
        monkeypatch.delenv(name)
    settings = ApiSettings.from_env("postgresql://127.0.0.1:1/unused")
    assert settings.rate_per_minute == 60
    # The limiter the app builds from it (orders/api/callers.py: RateLimiter(settings.rate_per_minute)),
    # on a frozen clock.
    limiter = RateLimiter(settings.rate_per_minute, clock=lambda: 1000.0)
    assert [limiter.allow("10.0.0.1") for _ in range(60)] == [0] * 60
    assert limiter.allow("10.0.0.1") >= 1  # the 61st within the minute waits (Retry-After)
    assert limiter.allow("10.0.0.2") == 0  # per client: another address is unaffected


# -- seed 001 §7: order_broker_latency_ms --------------------------------------------------------------
def test_an_order_delivered_to_the_broker_is_observed_in_order_broker_latency_ms(db_url, conn, http_sink):
    count, total = sample("order_broker_latency_ms_count"), sample("order_broker_latency_ms_sum")
    enqueue_n(conn, ORDERS, 1)
    report = run_table_relay(db_url, broker_settings(http_sink.url), ORDERS, once=True)
    assert report.sent == 1
    assert len(http_sink.received) == 1
    assert sample("order_broker_latency_ms_count") == count + 1
    assert sample("order_broker_latency_ms_sum") > total


# -- seed 002 セキュリティ / seed 004 §7: relay logs leave the payload out and carry the (maskable) tenant -----
def marked_messages(marker: str, tenant: str) -> list[Message]:
    """One message per fate (sent, retried then dead, dead at once), each payload carrying its own marker."""
    return [
        Message(
            topic=topic,
            event_id=f"ev-{topic}",
            tenant_id=tenant,
            payload={"email": f"{marker}-{topic}@example.com", "name": f"{marker}-{topic}-name"},
        )
        for topic in ("ok", "flaky", "poison")
    ]


def marked_registry() -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register("ok", lambda message: "done")

    def flaky(message):
        raise RuntimeError("downstream busy")

    def poison(message):
        raise PermanentError("cannot use this message", code="BAD_PAYLOAD")

    registry.register("flaky", flaky)
    registry.register("poison", poison)
    return registry


def run_marked_table(db_url: str, conn: psycopg.Connection, table: str, marker: str, tenant: str) -> None:
    """Relay the marked messages of ``table`` to their end: sent, dead at once, and dead after one retry."""
    create_table(db_url, table)
    Outbox(table).enqueue_many(conn, marked_messages(marker, tenant), outside_transaction=True)
    settings = TableSettings(
        name=table,
        destination="handlers",
        mode="competing",
        idle_sleep_s=0.01,
        retry=RetryPolicy(base_s=1, max_s=1, max_attempts=2, jitter=0),
    )
    destination = HandlerDestination(marked_registry())
    first = Relay(db_url, settings, destination).run(once=True)
    assert (first.sent, first.retried, first.dead) == (1, 1, 1)
    make_due(conn, table)
    second = Relay(db_url, settings, destination).run(once=True)
    assert (second.sent, second.retried, second.dead) == (0, 0, 1)
    assert statuses(conn, table) == {"sent": 1, "dead": 2}


def logged_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    texts = []
    for record in caplog.records:
        texts += [record.getMessage(), record.exc_text or "", repr(record.args)]
    return texts


@pytest.mark.parametrize("label_mode", ["plain", "hash"])
def test_relay_logs_never_hold_the_payload_and_name_the_tenant_masked_on_request(
    db_url, conn, caplog, monkeypatch, label_mode
):
    monkeypatch.setenv("OUTBOX_TENANT_LABEL", label_mode)
    marker, tenant = f"PII{uuid.uuid4().hex}", f"acme-{uuid.uuid4().hex[:8]}"
    table = f"gaps_logs_{label_mode}"
    caplog.set_level(logging.DEBUG)
    run_marked_table(db_url, conn, table, marker, tenant)

    texts = logged_texts(caplog)
    assert texts, "the relay logged nothing"
    assert not [t for t in texts if marker in t], "a payload reached the logs"

    shown = tenant if label_mode == "plain" else "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:10]
    if label_mode == "hash":
        assert not [t for t in texts if tenant in t], "the tenant was logged unmasked"
    lines = [r.getMessage() for r in caplog.records if r.name == "outbox_pipelines.relay"]
    retry = [line for line in lines if "(event ev-flaky" in line and "retries in" in line]
    assert len(retry) == 1 and f"(event ev-flaky, tenant {shown}) retries in" in retry[0], retry
    dead = [line for line in lines if "is dead after" in line]
    assert len(dead) == 2, dead
    assert any(f"(event ev-poison, tenant {shown}) is dead after 1 attempts: BAD_PAYLOAD" in line for line in dead)
    assert any(f"(event ev-flaky, tenant {shown}) is dead after 2 attempts: HANDLER_ERROR" in line for line in dead)


def test_a_batch_that_dies_whole_logs_ten_lines_and_one_for_the_rest(db_url, conn, caplog):
    """1,000 messages of one batch dying of one cause are one story: the first ten one by one, then a line with
    the rest by code and the command that lists them (the report and the audit still count every one)."""
    table = "gaps_logs_batch"
    create_table(db_url, table)
    registry = HandlerRegistry()

    def refuse(message):
        raise PermanentError("needs instrument", code="BAD_PAYLOAD")

    registry.register("order.x", refuse)
    Outbox(table).enqueue_many(
        conn, [Message(topic="order.x", payload={"n": n}) for n in range(25)], outside_transaction=True
    )
    settings = TableSettings(name=table, destination="handlers", mode="competing", batch_size=100)
    caplog.set_level(logging.INFO, logger="outbox_pipelines.relay")
    report = Relay(db_url, settings, HandlerDestination(registry)).run(once=True)
    assert report.dead == 25 and report.dead_by_code == {"BAD_PAYLOAD": 25}
    lines = [r.getMessage() for r in caplog.records if r.name == "outbox_pipelines.relay"]
    assert len([line for line in lines if "is dead after 1 attempts: BAD_PAYLOAD" in line]) == 10, lines
    rest = [line for line in lines if "more messages of this batch are dead" in line]
    assert rest == [
        f"{table}: and 15 more messages of this batch are dead (BAD_PAYLOAD=25 in all); "
        f"'outbox-pipelines replay --table {table} --error-code CODE --dry-run' lists them"
    ], lines
    assert statuses(conn, table) == {"dead": 25}


# -- seed 004 §7: last_error is a summary, never the payload ----------------------------------------------
def test_a_handler_error_stores_its_own_text_in_last_error_never_the_payload(db_url, conn):
    marker = f"PII{uuid.uuid4().hex}"
    run_marked_table(db_url, conn, "gaps_last_error", marker, "acme")
    found = {r["event_id"]: r for r in rows(conn, "gaps_last_error")}
    flaky, poison = found["ev-flaky"], found["ev-poison"]
    assert flaky["last_error"].startswith("gave up after 2 of 2 attempts: 1 of 1 handlers failed: ")
    assert flaky["last_error"].endswith("RuntimeError: downstream busy")
    assert poison["last_error"].endswith("BAD_PAYLOAD: cannot use this message")
    stored = [r["last_error"] or "" for r in found.values()]
    details = [
        r["detail"] or ""
        for r in conn.execute("SELECT detail FROM outbox_audit WHERE outbox_table = 'gaps_last_error'").fetchall()
    ]
    assert not [text for text in stored + details if marker in text], "a payload was stored as an error"


def test_an_http_500_echoing_the_request_stores_200_characters_of_the_answer_not_the_payload(db_url, conn, http_sink):
    """What the code stores for a 5xx: ``HTTP 500: '<first 200 characters of the answer body>'``.

    That is the destination's text; a destination that echoes the request puts at
    most those 200 characters of it in last_error, never the whole payload.
    """
    marker = f"PII{uuid.uuid4().hex}"
    http_sink.script = lambda key, attempt, body: (500, {}, b"echo " + json.dumps(body, separators=(",", ":")).encode())
    # jsonb keeps "pad" (shorter key) before "secret": the marker is past the first 200 characters of the echo.
    [row_id] = enqueue_n(conn, EVENTS, 1, payload=lambda i: {"pad": "p" * 300, "secret": marker})
    settings = table_settings(
        EVENTS,
        destination="http",
        url=http_sink.url,
        mode="competing",
        idle_sleep_s=0.01,
        retry=RetryPolicy(base_s=1, max_s=1, max_attempts=2, jitter=0),
        circuit_threshold=1000,
    )
    destination = HttpDestination(http_sink.url)
    try:
        for _ in range(2):
            make_due(conn, EVENTS)
            Relay(db_url, settings, destination).run(once=True)
    finally:
        destination.close()

    [received] = http_sink.received[:1]
    echo = "echo " + json.dumps(received.body, separators=(",", ":"))
    assert marker in echo and echo.index(marker) > 200
    row = rows(conn, EVENTS)[0]
    assert (row["id"], row["status"], row["last_error_code"]) == (row_id, "dead", m.BROKER_5XX)
    assert row["last_error"] == f"gave up after 2 of 2 attempts: HTTP 500: {echo[:200]!r}"
    assert len(row["last_error"]) <= ERROR_TEXT_LIMIT == 2000
    assert marker not in row["last_error"]


# -- seed 003 §8: outbox_flush_db_timeout ----------------------------------------------------------------
def test_a_settle_that_hits_the_statement_timeout_is_audited_as_outbox_flush_db_timeout(db_url, conn, monkeypatch):
    # The relay's sessions run with statement_timeout=30 s (RELAY_SESSION_OPTIONS); 100 ms here.
    monkeypatch.setattr(
        relay_session, "RELAY_SESSION_OPTIONS", "-c statement_timeout=100 -c plan_cache_mode=force_custom_plan"
    )
    [row_id] = enqueue_n(conn, EVENTS, 1)
    locker = psycopg.connect(db_url)  # not autocommit: the lock lasts until rollback
    released = threading.Event()

    def unlock_once_audited() -> None:
        deadline = time.monotonic() + 30
        with psycopg.connect(db_url, autocommit=True) as watcher:
            while time.monotonic() < deadline:
                if watcher.execute("SELECT 1 FROM outbox_audit WHERE code = 'outbox_flush_db_timeout'").fetchone():
                    break
                time.sleep(0.02)
        locker.rollback()
        released.set()

    watcher_thread = threading.Thread(target=unlock_once_audited, daemon=True)

    def deliver_then_lock(message):
        # Delivered; before the relay settles, another session takes the table.
        if not watcher_thread.is_alive() and not released.is_set():
            locker.execute(f"LOCK TABLE {EVENTS} IN ACCESS EXCLUSIVE MODE")
            watcher_thread.start()
        return Outcome.sent(ref="ref-1")

    settings = table_settings(EVENTS, mode="competing", idle_sleep_s=0.01)
    try:
        report = Relay(db_url, settings, ScriptedDestination(deliver_then_lock)).run(once=True, max_seconds=30)
        watcher_thread.join(timeout=30)
    finally:
        locker.close()
    assert released.is_set()
    assert report.db_errors >= 1

    audited = conn.execute(
        "SELECT message_id, error_code, detail FROM outbox_audit WHERE code = 'outbox_flush_db_timeout' ORDER BY id"
    ).fetchall()
    assert audited[0]["message_id"] == row_id  # the batch whose settle was cancelled
    assert audited[0]["error_code"] == "QueryCanceled"
    assert "statement timeout" in audited[0]["detail"]
    # Nothing lost: the cancelled settle recorded nothing; the row is given back (at once, or when its lease
    # ends) and delivered again — the idempotency key makes that once in effect.
    row = rows(conn, EVENTS)[0]
    if row["status"] == "sending":  # the give-back itself ran into the lock: the lease brings the row back
        expire_leases(conn, EVENTS, by=timedelta(0))
        monkeypatch.undo()
        assert Relay(db_url, settings, ScriptedDestination()).run(once=True).sent == 1
        row = rows(conn, EVENTS)[0]
    assert (row["status"], row["attempts"]) == ("sent", 2)
    assert audit_codes(conn, EVENTS, row_id)[:2] == ["outbox_claim", "outbox_flush_db_timeout"]


# -- seed 004 §4.1: CHECK (attempts >= 0) ----------------------------------------------------------------
def test_the_database_refuses_a_negative_attempt_count(conn):
    [row_id] = enqueue_n(conn, EVENTS, 1)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"UPDATE {EVENTS} SET attempts = -1 WHERE id = %s", (row_id,))
    assert rows(conn, EVENTS)[0]["attempts"] == 0


# -- seed 004 §10.1 / §10.3: the relay and cleaner switches --------------------------------------------------
def test_relay_enabled_false_makes_the_relay_do_nothing_and_keeps_the_rows_pending(cli_env, conn):
    ids = [
        r.id
        for r in Outbox(EVENTS).enqueue_many(
            conn,
            [Message(topic="org.changed", payload={"org_id": i}, event_id=f"off-{i}") for i in range(3)],
            outside_transaction=True,
        )
    ]
    disabled = run_cli({**cli_env, "OUTBOX_RELAY_ENABLED": "false"}, "relay", "--table", EVENTS, "--once")
    assert disabled.returncode == 0, disabled.stderr
    assert f"relay is disabled for {EVENTS}" in disabled.stderr
    assert [(r["status"], r["attempts"]) for r in rows(conn, EVENTS)] == [("pending", 0)] * 3
    assert audit_codes(conn, EVENTS) == []

    enabled = run_cli(cli_env, "relay", "--table", EVENTS, "--once")  # the same rows, the switch left at its default
    assert enabled.returncode == 0, enabled.stderr
    assert [r["status"] for r in rows(conn, EVENTS)] == ["sent"] * len(ids)


def test_cleaner_enabled_false_makes_clean_skip_the_table_and_keep_old_sent_rows(cli_env, conn):
    enqueue_n(conn, EVENTS, 2)
    make_sent(conn, EVENTS, age=timedelta(days=30))
    disabled = run_cli({**cli_env, "OUTBOX_CLEANER_ENABLED": "false"}, "clean", "--table", EVENTS)
    assert disabled.returncode == 0, disabled.stderr
    assert f"{EVENTS}: cleaner disabled" in disabled.stdout
    assert statuses(conn, EVENTS) == {"sent": 2}

    enabled = run_cli(cli_env, "clean", "--table", EVENTS)  # the default: the same old rows go
    assert enabled.returncode == 0, enabled.stderr
    assert statuses(conn, EVENTS) == {}


# -- seed 004 §10.1: OUTBOX_RELAY_BATCH_SIZE, OUTBOX_RELAY_MAX_ATTEMPTS, OUTBOX_RELAY_POLL_INTERVAL -----------
def test_relay_batch_size_is_read_when_outbox_batch_size_is_unset():
    assert GlobalSettings.from_env({"OUTBOX_RELAY_BATCH_SIZE": "40"}).batch_size == 40
    assert GlobalSettings.from_env({"OUTBOX_RELAY_BATCH_SIZE": "40", "OUTBOX_BATCH_SIZE": "32"}).batch_size == 32
    assert GlobalSettings.from_env({}).batch_size == 100
    assert load_settings(env={"OUTBOX_RELAY_BATCH_SIZE": "40"}, path=None).table(EVENTS).batch_size == 40


def test_relay_max_attempts_defaults_to_25_for_generic_tables():
    settings = load_settings(env={}, path=None)
    assert settings.table(EVENTS).retry.max_attempts == 25
    assert settings.table(ORDERS).retry.max_attempts == 8  # OUTBOX_RETRY_MAX's table, not this variable's
    assert load_settings(env={"OUTBOX_RELAY_MAX_ATTEMPTS": ""}, path=None).table(EVENTS).retry.max_attempts == 25


def test_relay_poll_interval_defaults_to_1s_and_reads_durations():
    assert GlobalSettings.from_env({}).poll_interval_s == 1.0
    assert GlobalSettings.from_env({"OUTBOX_RELAY_POLL_INTERVAL": "500ms"}).poll_interval_s == 0.5
    assert GlobalSettings.from_env({"OUTBOX_RELAY_POLL_INTERVAL": "2s"}).poll_interval_s == 2.0
    assert load_settings(env={"OUTBOX_RELAY_POLL_INTERVAL": "500ms"}, path=None).table(EVENTS).poll_interval_s == 0.5


# -- seed 004 §3.2 D3: single-active unless a table says otherwise ------------------------------------------
def test_a_table_declared_without_a_mode_is_single_active(tmp_path):
    path = tmp_path / "outbox.toml"
    path.write_text(
        DEMO_PARTS
        + '[tables.hrm_outbox]\ndestination = "handlers"\nhandlers = "outbox_pipelines.examples.handlers:registry"\n\n'
        "[tables.outbox_orders]\nmax_attempts = 5\n"
    )
    settings = load_settings(env={}, path=path)
    assert settings.table("hrm_outbox").mode == "single-active"
    assert settings.table(EVENTS).mode == "single-active"
    assert settings.table("outbox_members").mode == "single-active"
    # The shipped competing tables stay competing, also when a config file touches them without a mode.
    assert (settings.table(ORDERS).mode, settings.table(ORDERS).retry.max_attempts) == ("competing", 5)
    assert settings.table("outbox_memory").mode == "competing"
