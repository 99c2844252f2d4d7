"""Issue 43, "alerts that name the cause, once": a topic paused on purpose is a visible state and never pages as
lag; a blocked key says why its head died and the exact command; one destination outage gives one alert (its
lag and backlog follow from it), and a lag that outlasts the outage alerts then.

Against real PostgreSQL, real relays and a real HTTP receiver for the alerts; the sweeps run on an injected
clock (the database's time plus whole minutes), as the on-call sensor would run them over the outage.
"""

import json
import re
from dataclasses import replace
from datetime import timedelta

from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.destinations.handlers import HandlerDestination, HandlerRegistry
from outbox_pipelines.core.oncall.sweep import sweep, table_verdicts
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.settings import Settings, load_settings
from outbox_pipelines.defs.alerts import run_link
from outbox_pipelines.defs.links import UI_URL_ENV, DagsterLinks
from outbox_pipelines_tests.conftest import REPO, run_cli, table_settings
from outbox_pipelines_tests.helpers import db_now, enqueue_n
from outbox_pipelines_tests.processes import free_port
from outbox_pipelines_tests.rows import make_dead
from outbox_pipelines_tests.sink import HttpSink

EVENTS = "outbox_events"
SHIPPED = load_settings(env={}, path=None)  # lag p95 warn 60 s / error 5 min; destination failing 30 s / 5 min
PAUSED = "emails.welcome"


def settings_with(**overrides: object) -> Settings:
    """The shipped settings, the events table's section changed by ``overrides``."""
    return replace(SHIPPED, tables={**SHIPPED.tables, EVENTS: replace(SHIPPED.tables[EVENTS], **overrides)})


def verdicts(conn, settings: Settings, *, later_s: float = 0.0) -> dict:
    return {v.name: v for v in table_verdicts(conn, settings, EVENTS, now=db_now(conn) + timedelta(seconds=later_s))}


# -- a paused topic is a state, not lag ------------------------------------------------------------------


def test_a_topic_paused_in_the_settings_is_shown_and_is_not_lag(conn):
    enqueue_n(conn, EVENTS, 3, topic=PAUSED, prefix="p")
    settings = settings_with(paused_topics=(PAUSED,))

    lag = verdicts(conn, settings, later_s=3600)["lag"]  # an hour later, nothing of them delivered
    assert lag.severity == "ok", lag.description
    assert f"Paused on purpose, not lag: {PAUSED} (by the table's settings (paused_topics))" in lag.description
    assert "3 messages wait there, the oldest for 60 min" in lag.description
    assert "Check that a relay run is active" not in lag.description
    assert (lag.metadata["paused_topics"], lag.metadata["paused_waiting"]) == (PAUSED, 3)

    # The same messages without the pause are an hour late: the check fails as before.
    assert verdicts(conn, SHIPPED, later_s=3600)["lag"].severity == "error"


def test_the_other_topics_lag_still_counts_beside_a_paused_one(conn):
    enqueue_n(conn, EVENTS, 3, topic=PAUSED, prefix="p")
    enqueue_n(conn, EVENTS, 2, topic="orders.created", prefix="o")
    lag = verdicts(conn, settings_with(paused_topics=(PAUSED,)), later_s=600)["lag"]
    assert lag.severity == "error", lag.description
    assert lag.metadata["waiting_now"] == 2  # the paused topic's 3 are not among them
    assert "Check that a relay run is active for the table" in lag.description
    assert "Paused on purpose, not lag: emails.welcome" in lag.description


def test_a_topic_its_handlers_switched_off_is_recorded_by_the_relay_with_its_time(db_url, conn):
    registry = HandlerRegistry()
    registry.register(PAUSED, lambda message: None)
    registry.register("orders.created", lambda message: None)
    registry.set_enabled(PAUSED, False)  # an operator's switch at run time (a feature flag)
    enqueue_n(conn, EVENTS, 2, topic=PAUSED, prefix="p")
    enqueue_n(conn, EVENTS, 2, topic="orders.created", prefix="o")
    before = db_now(conn)
    Relay(db_url, table_settings(EVENTS, mode="competing"), HandlerDestination(registry)).run(once=True)

    lag = verdicts(conn, SHIPPED, later_s=3600)["lag"]  # the settings pause nothing: the relay told it
    assert lag.severity == "ok", lag.description
    assert f"{PAUSED} (by its handlers (HandlerRegistry.set_enabled) since {before:%Y-%m-%d} " in lag.description
    assert "2 messages wait there" in lag.description

    # Switched on again: the next relay records that, delivers them, and the pause is gone from the check.
    registry.set_enabled(PAUSED, True)
    Relay(db_url, table_settings(EVENTS, mode="competing"), HandlerDestination(registry)).run(once=True)
    lag = verdicts(conn, SHIPPED)["lag"]
    assert "paused" not in lag.description.lower() and lag.metadata.get("paused_topics") is None


def test_a_table_whose_relaying_is_off_waits_on_purpose(conn):
    enqueue_n(conn, EVENTS, 4)
    lag = verdicts(conn, settings_with(relay_enabled=False), later_s=3600)["lag"]
    assert lag.severity == "ok"
    assert "relaying is switched off (relay_enabled = false): 4 messages wait on purpose" in lag.description


def test_status_shows_the_paused_topics(cli_env, conn, tmp_path):
    config = tmp_path / "outbox.toml"
    config.write_text(f'[tables.{EVENTS}]\ndestination = "paper"\npaused_topics = ["{PAUSED}"]\n')
    enqueue_n(conn, EVENTS, 2, topic=PAUSED, prefix="p")
    result = run_cli({**cli_env, "OUTBOX_CONFIG": str(config)}, "status")
    assert result.returncode == 0, result.stderr
    assert (
        f"{EVENTS}: paused topics: {PAUSED} (by the table's settings (paused_topics)); 2 messages wait there"
        in result.stdout
    )
    shown = json.loads(run_cli({**cli_env, "OUTBOX_CONFIG": str(config)}, "status", "--json").stdout)
    assert shown[0]["paused_waiting"] == 2 and shown[0]["paused_topics"][0]["topic"] == PAUSED


# -- blocked keys say why ----------------------------------------------------------------------------------


def test_a_blocked_key_says_why_its_head_died_and_the_command_to_act(conn):
    [head] = enqueue_n(conn, EVENTS, 1, prefix="head")
    conn.execute(f"UPDATE {EVENTS} SET ordering_key = 'c-7' WHERE id = %s", (head,))
    [later] = enqueue_n(conn, EVENTS, 1, prefix="later")
    conn.execute(f"UPDATE {EVENTS} SET ordering_key = 'c-7' WHERE id = %s", (later,))
    make_dead(conn, EVENTS, [head], code="CONNECTION_REFUSED", error="connection failed: refused, token=s3cr3t")

    blocked = verdicts(conn, SHIPPED)["blocked_keys"]
    text = blocked.description
    assert f"key c-7: id {head} died with CONNECTION_REFUSED (connection failed: refused" in text, text
    assert "s3cr3t" not in text  # the error text is redacted
    assert f"'outbox-pipelines replay --table {EVENTS} --id {head} --dry-run'" in text
    assert f"'outbox-pipelines skip --table {EVENTS} --id {head} --dry-run'" in text
    assert "--id ID" not in text
    assert text.count(f"id {head}") == 3  # named once with why it died, then once in each command
    assert blocked.metadata["blocked_codes"] == "CONNECTION_REFUSED"


# -- one cause, one alert ---------------------------------------------------------------------------------


def relay(db_url, url: str, **budget: object):
    destination = HttpDestination(url, timeout_s=2)
    try:
        # The sweeps' clock moves by minutes, the relays' (backoffs, probes) by the seconds the test takes. After
        # minutes of an outage the circuit is open (10 failures open it), so every message waits for the next probe
        # and the first success makes them all due: here it opens at the first failure, whatever the test's speed.
        # With 10, a test that ran its 14 sweeps within the first backoff (1 s) left the circuit closed and the
        # messages in backoff after the recovery: no resolution, no drain. A probe whenever the circuit is open.
        settings = table_settings(
            EVENTS, mode="competing", idle_sleep_s=0.01, batch_size=1, circuit_threshold=1, probe_interval_s=0.01
        )
        return Relay(db_url, settings, destination).run(**({"once": True} | budget))
    finally:
        destination.close()


def test_one_destination_outage_gives_one_alert_and_a_lag_that_outlasts_it_alerts_then(db_url, conn, http_sink):
    """The issue's outage: a webhook that refuses connections for 13 minutes, a sweep a minute. Before: the
    destination's WARN and ERROR, then the lag's WARN and ERROR (4 alerts; 6 posts with the resolutions)."""
    closed = f"http://127.0.0.1:{free_port()}/"
    receiver = HttpSink().start()
    try:
        enqueue_n(conn, EVENTS, 5)
        relay(db_url, closed)  # the outage starts
        t0 = db_now(conn)
        told: list[tuple[int, str, str, str]] = []
        lag_during: list[str] = []
        for minute in range(14):  # the outage: the relay keeps failing, the sensor sweeps every minute
            relay(db_url, closed)
            report = sweep(db_url, SHIPPED, now=t0 + timedelta(minutes=minute), webhook_url=http_sink.url)
            told += [(minute, a["check"], a["status"], a["severity"]) for a in report.alerts]
            lag_during.append(next(v for v in report.verdicts[EVENTS] if v.name == "lag").severity)
        assert told == [(1, "destination", "firing", "warning"), (5, "destination", "firing", "error")], told
        assert "error" in lag_during  # the lag check fails in the UI meanwhile; its alert is held
        lag = verdicts(conn, SHIPPED, later_s=13 * 60)["lag"]
        assert "This follows from the destination: deliveries to" in lag.description
        assert "CONNECTION_REFUSED=" in lag.description

        # The destination answers again, but one message goes per batch: the rest are still late.
        assert relay(db_url, receiver.url, once=False, max_entries=1, max_seconds=60).sent == 1
        report = sweep(db_url, SHIPPED, now=t0 + timedelta(minutes=14), webhook_url=http_sink.url)
        after = {(a["check"], a["status"], a["severity"]) for a in report.alerts}
        assert after == {("destination", "resolved", "error"), ("lag", "firing", "error")}, after
        # Drained: the lag resolves, once.
        assert relay(db_url, receiver.url).sent == 4
        report = sweep(db_url, SHIPPED, now=t0 + timedelta(minutes=15), webhook_url=http_sink.url)
        assert [(a["check"], a["status"]) for a in report.alerts] == [("lag", "resolved")]
        assert len(http_sink.received) == 5  # 2 for the outage, its resolution, the late lag and its resolution
    finally:
        receiver.stop()


def test_an_outage_that_clears_with_the_backlog_drained_is_three_posts(db_url, conn, http_sink):
    closed = f"http://127.0.0.1:{free_port()}/"
    receiver = HttpSink().start()
    try:
        enqueue_n(conn, EVENTS, 5)
        relay(db_url, closed)  # the outage starts
        t0 = db_now(conn)
        for minute in range(14):
            relay(db_url, closed)
            sweep(db_url, SHIPPED, now=t0 + timedelta(minutes=minute), webhook_url=http_sink.url)
        # Until the five are sent: the first is the circuit's probe, due 10 ms after the last one (real time).
        assert relay(db_url, receiver.url, once=False, max_entries=5, max_seconds=60).sent == 5
        sweep(db_url, SHIPPED, now=t0 + timedelta(minutes=14), webhook_url=http_sink.url)
        posted = [(r.body["check"], r.body["status"], r.body["severity"]) for r in http_sink.received]
        assert posted == [
            ("destination", "firing", "warning"),
            ("destination", "firing", "error"),
            ("destination", "resolved", "error"),
        ], posted
        assert "CONNECTION_REFUSED" in http_sink.received[0].body["text"]
    finally:
        receiver.stop()


# -- links point at the UI that serves -------------------------------------------------------------------


def test_every_alert_link_starts_at_the_ui_that_serves(db_url, conn, http_sink, monkeypatch):
    monkeypatch.setenv(UI_URL_ENV, "http://127.0.0.1:13400/")  # as `dev --port 13400` sets it
    enqueue_n(conn, EVENTS, 2)
    make_dead(conn, EVENTS, code="BROKER_5XX")
    report = sweep(db_url, SHIPPED, webhook_url=http_sink.url, links=DagsterLinks())
    assert report.alerts, "a dead message alerts"
    assert all(a["link"].startswith("http://127.0.0.1:13400/assets/outbox/") for a in report.alerts), report.alerts
    assert run_link("0123abcd")["link"] == "http://127.0.0.1:13400/runs/0123abcd"


def test_no_module_writes_the_ui_address_but_the_links_module():
    """Every link goes through defs/links.py's ui_url() (OUTBOX_UI_URL): no other module spells a UI URL."""
    literal = re.compile(r"[\"']https?://(?:127\.0\.0\.1|localhost):3000")
    spelled = [
        str(path.relative_to(REPO))
        for path in (REPO / "outbox_pipelines").rglob("*.py")
        if literal.search(path.read_text()) and path.name != "links.py"
    ]
    assert spelled == []
