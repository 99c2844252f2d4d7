"""Alerts on-call can trust: fired once, reminded rarely, resolved once, never lost, never leaking a secret."""

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core.oncall import alerts
from outbox_pipelines.core.oncall.alerts import Condition, Memory, announce, decide
from outbox_pipelines.core.oncall.health import CHECK_NAMES, CheckVerdict
from outbox_pipelines.core.oncall.sweep import check_condition
from outbox_pipelines.defs.links import UI_URL_ENV, DagsterLinks
from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.processes import free_port

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
REPEAT = 1800.0
TABLES = ("outbox_orders", "outbox_memory", "outbox_events", "outbox_members")


@pytest.fixture(autouse=True)
def _no_alert_env(monkeypatch):
    for name in (alerts.ALERT_WEBHOOK_ENV, alerts.ALERT_REPEAT_ENV, UI_URL_ENV):
        monkeypatch.delenv(name, raising=False)


def cond(
    severity: str, key: str = "check:outbox_orders:lag", summary: str = "outbox_orders: lag p95 2.0 min.", **extra
) -> Condition:
    return Condition(
        key=key,
        severity=severity,
        summary=summary,
        kind=extra.pop("kind", "check"),  # type: ignore[arg-type]
        link=extra.pop("link", DagsterLinks().table("outbox_orders")),
        table=extra.pop("table", "outbox_orders"),
        check=extra.pop("check", "lag"),
        **extra,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- the policy (pure) ---------------------------------------------------------


@pytest.mark.parametrize(
    "previous, current, expected",
    [
        ("ok", "ok", None),
        ("ok", "warning", "firing"),
        ("ok", "error", "firing"),
        ("warning", "error", "firing"),  # escalation is told again
        ("error", "warning", None),  # easing is not news...
        ("warning", "warning", None),
        ("error", "error", None),
        ("warning", "ok", "resolved"),
        ("error", "ok", "resolved"),
    ],
)
def test_decide_transitions_within_the_repeat_interval(previous, current, expected):
    memory = Memory() if previous == "ok" else Memory(previous, at(0), at(0), "s")  # type: ignore[arg-type]
    action, remembered = decide(memory, cond(current), at(60), REPEAT)
    assert action == expected
    assert remembered.severity == current  # ...but always remembered


def test_decide_firing_starts_the_condition_and_escalation_keeps_its_start():
    action, fired = decide(Memory(), cond("warning"), at(0), REPEAT)
    assert (action, fired) == ("firing", Memory("warning", at(0), at(0), cond("warning").summary))
    action, escalated = decide(fired, cond("error"), at(100), REPEAT)
    assert action == "firing"
    assert (escalated.severity, escalated.started_at, escalated.notified_at) == ("error", at(0), at(100))


def test_decide_reminds_exactly_at_repeat_s_and_not_before():
    fired = Memory("warning", at(0), at(0), "s")
    assert decide(fired, cond("warning"), at(REPEAT - 0.001), REPEAT)[0] is None
    action, reminded = decide(fired, cond("warning"), at(REPEAT), REPEAT)
    assert action == "reminder"
    assert (reminded.started_at, reminded.notified_at) == (at(0), at(REPEAT))
    # the next reminder counts from the last one
    assert decide(reminded, cond("warning"), at(2 * REPEAT - 1), REPEAT)[0] is None
    assert decide(reminded, cond("warning"), at(2 * REPEAT), REPEAT)[0] == "reminder"


def test_decide_de_escalation_then_re_escalation_fires_again():
    fired = Memory("error", at(0), at(0), "s")
    action, eased = decide(fired, cond("warning"), at(10), REPEAT)
    assert action is None
    assert (eased.severity, eased.started_at, eased.notified_at) == ("warning", at(0), at(0))
    action, again = decide(eased, cond("error"), at(20), REPEAT)
    assert action == "firing"
    assert (again.severity, again.started_at, again.notified_at) == ("error", at(0), at(20))


def test_decide_resolved_once_then_a_new_start():
    action, resolved = decide(Memory("error", at(0), at(0), "s"), cond("ok"), at(600), REPEAT)
    assert action == "resolved"
    assert (resolved.severity, resolved.started_at, resolved.notified_at) == ("ok", at(0), at(600))
    assert decide(resolved, cond("ok"), at(700), REPEAT)[0] is None
    action, new = decide(resolved, cond("warning"), at(800), REPEAT)
    assert action == "firing" and new.started_at == at(800)


# -- announce: many conditions, the database remembers --------------------------

SEVERITY_OF = {  # table -> check -> verdict severity
    "outbox_orders": {  # no lag or backlog here: the destination's outage would hold theirs (test_one_cause_alerts.py)
        "lag": "ok",
        "dead_letters": "error",
        "stuck": "warn",
        "backlog": "ok",
        "destination": "error",
        "relay": "ok",
        "blocked_keys": "ok",
    },
    "outbox_memory": {name: "ok" for name in CHECK_NAMES},
    "outbox_events": {
        "lag": "ok",
        "dead_letters": "warn",
        "stuck": "warn",
        "backlog": "ok",
        "destination": "ok",
        "relay": "ok",
        "blocked_keys": "ok",
    },
    "outbox_members": {
        "lag": "error",
        "dead_letters": "ok",
        "stuck": "ok",
        "backlog": "warn",
        "destination": "ok",
        "relay": "ok",
        "blocked_keys": "ok",
    },
}


def conditions(severity_of) -> list[Condition]:
    return [
        check_condition(
            table,
            CheckVerdict(
                check, severity_of[table][check], f"{table}: {check} is {severity_of[table][check]}.", {"n": 1}
            ),
            DagsterLinks(),
        )
        for table in TABLES
        for check in CHECK_NAMES
    ]


def posted(sink) -> list[dict]:
    return [r.body for r in sink.received]


def alert_state(conn) -> dict[str, str]:
    return {r["alert_key"]: r["severity"] for r in conn.execute("SELECT alert_key, severity FROM outbox_alert_state")}


def test_announce_posts_each_non_ok_condition_once_and_resolves_once(conn, http_sink):
    first = conditions(SEVERITY_OF)
    assert len(first) == 4 * len(CHECK_NAMES)
    non_ok = {f"check:{t}:{c}": s for t in TABLES for c, s in SEVERITY_OF[t].items() if s != "ok"}
    assert len(non_ok) == 7

    sent = announce(conn, first, now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    bodies = posted(http_sink)
    assert sent == bodies
    assert sorted(b["alert_key"] for b in bodies) == sorted(non_ok)
    assert {b["alert_key"]: b["severity"] for b in bodies} == {
        k: {"warn": "warning", "error": "error"}[s] for k, s in non_ok.items()
    }
    assert all(b["status"] == "firing" and not b["reminder"] for b in bodies)
    assert alert_state(conn) == {k: {"warn": "warning", "error": "error"}[s] for k, s in non_ok.items()}

    # Same conditions a minute later: nothing new to tell.
    assert announce(conn, conditions(SEVERITY_OF), now=at(60), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    assert len(http_sink.received) == 7

    # Three recover: exactly those are resolved, with the severity they had.
    recovered = {
        **SEVERITY_OF,
        "outbox_orders": {**SEVERITY_OF["outbox_orders"], "dead_letters": "ok"},
        "outbox_events": {**SEVERITY_OF["outbox_events"], "stuck": "ok", "dead_letters": "ok"},
    }
    sent = announce(conn, conditions(recovered), now=at(600), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert {b["alert_key"]: (b["status"], b["severity"]) for b in sent} == {
        "check:outbox_orders:dead_letters": ("resolved", "error"),
        "check:outbox_events:stuck": ("resolved", "warning"),
        "check:outbox_events:dead_letters": ("resolved", "warning"),
    }
    assert all(b["resolved_at"] == at(600).isoformat() and b["started_at"] == at(0).isoformat() for b in sent)
    assert len(http_sink.received) == 10
    # ... and never again
    assert announce(conn, conditions(recovered), now=at(660), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    assert len(http_sink.received) == 10


@pytest.mark.slow
def test_a_restarted_process_does_not_repeat_what_was_told(db_url, conn, http_sink):
    announce(conn, conditions(SEVERITY_OF), now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert len(http_sink.received) == 7
    # another connection (another sensor tick)...
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as other:
        assert announce(other, conditions(SEVERITY_OF), now=at(30), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    # ... and another process, with nothing in memory but the database
    script = (
        "import sys, psycopg\n"
        "from datetime import datetime, timedelta, timezone\n"
        "from outbox_pipelines.core.oncall.alerts import announce\n"
        "from outbox_pipelines_tests.core.oncall.test_alerts import SEVERITY_OF, conditions, at\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
        "    print(len(announce(conn, conditions(SEVERITY_OF), now=at(90), repeat_s=1800, webhook_url=sys.argv[2])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, db_url, http_sink.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert len(http_sink.received) == 7


def test_a_refused_alert_is_not_remembered_and_is_posted_again(conn, http_sink):
    http_sink.script = lambda key, attempt, body: (500, {}, b"webhook down")
    condition = cond("error", key="check:outbox_orders:destination")
    assert announce(conn, [condition], now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    assert len(http_sink.received) == 1
    assert alert_state(conn) == {}  # nothing remembered: the alert was not delivered

    http_sink.script = None
    [body] = announce(conn, [condition], now=at(15), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert (body["status"], body["reminder"], body["severity"]) == ("firing", False, "error")
    assert len(http_sink.received) == 2
    assert alert_state(conn) == {"check:outbox_orders:destination": "error"}
    assert announce(conn, [condition], now=at(30), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    assert len(http_sink.received) == 2


def test_one_refused_alert_among_many_is_the_only_one_retried(conn, http_sink):
    refused = "check:outbox_members:lag"
    http_sink.script = lambda key, attempt, body: (503, {}, b"busy") if body["alert_key"] == refused else None
    sent = announce(conn, conditions(SEVERITY_OF), now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert len(sent) == 6 and refused not in {b["alert_key"] for b in sent}
    assert refused not in alert_state(conn)
    http_sink.script = None
    [again] = announce(conn, conditions(SEVERITY_OF), now=at(15), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert again["alert_key"] == refused
    assert [b["alert_key"] for b in posted(http_sink)].count(refused) == 2
    assert len(http_sink.received) == 8


def test_a_refused_resolution_is_posted_again(conn, http_sink):
    key = "check:outbox_orders:stuck"
    announce(conn, [cond("warning", key=key)], now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    http_sink.script = lambda key_, attempt, body: (500, {}, b"")
    assert announce(conn, [cond("ok", key=key)], now=at(60), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    assert alert_state(conn) == {key: "warning"}
    http_sink.script = None
    [body] = announce(conn, [cond("ok", key=key)], now=at(120), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert body["status"] == "resolved"
    assert alert_state(conn) == {key: "ok"}


def test_reminders_every_repeat_interval_in_injected_time(conn, http_sink):
    still = [cond("warning")]
    announce(conn, still, now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    for seconds in (60, REPEAT - 1):
        assert announce(conn, still, now=at(seconds), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    [reminder] = announce(conn, still, now=at(REPEAT), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert (reminder["status"], reminder["reminder"], reminder["started_at"]) == ("firing", True, at(0).isoformat())
    assert reminder["text"].startswith("*STILL FIRING* after 30 min [warning]")
    assert announce(conn, still, now=at(REPEAT + 60), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    [second] = announce(conn, still, now=at(2 * REPEAT), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert second["reminder"] is True
    assert len(http_sink.received) == 3


def test_the_repeat_interval_comes_from_the_environment(conn, http_sink, monkeypatch):
    monkeypatch.setenv(alerts.ALERT_REPEAT_ENV, "10m")
    still = [cond("error")]
    announce(conn, still, now=at(0), webhook_url=http_sink.url)
    assert announce(conn, still, now=at(599), webhook_url=http_sink.url) == []
    assert [b["reminder"] for b in announce(conn, still, now=at(600), webhook_url=http_sink.url)] == [True]


def test_the_webhook_url_comes_from_the_environment(conn, http_sink, monkeypatch):
    monkeypatch.setenv(alerts.ALERT_WEBHOOK_ENV, http_sink.url)
    announce(conn, [cond("warning")], now=at(0), repeat_s=REPEAT)
    assert [b["alert_key"] for b in posted(http_sink)] == ["check:outbox_orders:lag"]


def test_escalation_and_re_escalation_are_posted(conn, http_sink):
    key = "check:outbox_orders:lag"
    for seconds, severity in ((0, "warning"), (10, "error"), (20, "warning"), (30, "error"), (40, "ok")):
        announce(conn, [cond(severity, key=key)], now=at(seconds), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert [(b["status"], b["severity"]) for b in posted(http_sink)] == [
        ("firing", "warning"),
        ("firing", "error"),
        ("firing", "error"),
        ("resolved", "error"),
    ]


# -- what on-call receives -------------------------------------------------------


def test_payload_fields_of_firing_and_resolved(conn, http_sink, monkeypatch):
    monkeypatch.setenv(UI_URL_ENV, "https://dagster.example.com/")
    [condition] = [c for c in conditions(SEVERITY_OF) if c.key == "check:outbox_orders:dead_letters"]
    [firing] = announce(conn, [condition], now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert firing == http_sink.received[0].body
    assert firing["status"] == "firing" and firing["reminder"] is False
    assert (firing["severity"], firing["kind"], firing["table"], firing["check"]) == (
        "error",
        "check",
        "outbox_orders",
        "dead_letters",
    )
    assert firing["summary"] == "outbox_orders: dead_letters is error."
    # The Checks tab opened on the check that fires (the UI opens on the first by name otherwise).
    assert (
        firing["link"] == "https://dagster.example.com/assets/outbox/outbox_orders?view=checks&checkDetail=dead_letters"
    )
    assert firing["summary"] in firing["text"] and firing["link"] in firing["text"]
    assert firing["text"].startswith("*FIRING* [error]") and "|Open in Dagster>" in firing["text"]
    assert firing["started_at"] == at(0).isoformat()
    assert firing["figures"] == {"n": 1}
    assert "resolved_at" not in firing

    ok = check_condition(
        "outbox_orders", CheckVerdict("dead_letters", "ok", "outbox_orders: 0 dead messages.", {}), DagsterLinks()
    )
    [resolved] = announce(conn, [ok], now=at(600), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert (resolved["status"], resolved["severity"]) == ("resolved", "error")
    assert resolved["started_at"] == at(0).isoformat()
    assert resolved["resolved_at"] == at(600).isoformat()
    assert resolved["text"].startswith("*RESOLVED* after 10 min [error]")
    assert resolved["link"].startswith("https://dagster.example.com/")


def test_the_link_defaults_to_the_local_dagster_ui():
    condition = check_condition("outbox_events", CheckVerdict("lag", "warn", "x", {}), DagsterLinks())
    assert condition.link == "http://127.0.0.1:3000/assets/outbox/outbox_events?view=checks&checkDetail=lag"
    assert DagsterLinks().run("abc-123") == "http://127.0.0.1:3000/runs/abc-123"


def test_without_a_ui_an_alert_carries_no_link(conn, http_sink):
    """The engine knows no UI: a sweep not given one (a script of the team's own) tells the same, linkless."""
    condition = check_condition("outbox_events", CheckVerdict("lag", "warn", "outbox_events: lag.", {}))
    [body] = announce(conn, [condition], now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert body["link"] == "" and body["text"] == "*FIRING* [warning] outbox_events: lag."


def test_secrets_in_a_summary_never_reach_the_webhook(conn, http_sink, caplog):
    condition = cond(
        "error",
        key="check:outbox_orders:destination",
        summary="outbox_orders: deliveries to http://user:secretpw@host/x have failed for 45.0s.",
        figures={"destination": "http://user:secretpw@host/x", "failures": 3},
    )
    with caplog.at_level(logging.DEBUG):
        announce(conn, [condition], now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    [received] = http_sink.received
    raw = json.dumps(received.body)
    assert "secretpw" not in raw
    assert "http://***@host/x" in received.body["summary"]
    assert received.body["figures"] == {"destination": "http://***@host/x", "failures": 3}
    assert "secretpw" not in caplog.text


def test_a_webhook_url_with_credentials_is_never_logged_with_its_password(conn, http_sink, caplog):
    with_credentials = http_sink.url.replace("http://", "http://alerts:secretpw@")
    http_sink.script = lambda key, attempt, body: (500, {}, b"nope")
    # INFO: what a service typically logs (httpx logs every request at INFO)
    with caplog.at_level(logging.INFO):
        assert announce(conn, [cond("warning")], now=at(0), repeat_s=REPEAT, webhook_url=with_credentials) == []
    assert "answered HTTP 500" in caplog.text
    assert "alerts:secretpw" not in caplog.text and "secretpw" not in caplog.text
    # unreachable too (a closed port)
    port = free_port()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert alerts.post_alert({"text": "t"}, f"http://alerts:secretpw@127.0.0.1:{port}/hook", timeout_s=2) is False
    assert "unreachable" in caplog.text
    assert "secretpw" not in caplog.text


def test_without_a_webhook_alerts_are_logged_and_remembered(conn, caplog):
    with caplog.at_level(logging.WARNING, logger="outbox_pipelines.alerts"):
        [body] = announce(conn, [cond("warning")], now=at(0), repeat_s=REPEAT)
    assert body["status"] == "firing"
    assert "outbox alert: *FIRING* [warning]" in caplog.text
    assert alert_state(conn) == {"check:outbox_orders:lag": "warning"}
    assert announce(conn, [cond("warning")], now=at(60), repeat_s=REPEAT) == []


def test_an_event_is_told_once_with_its_own_fields(http_sink):
    condition = Condition(
        key="run:r1",
        severity="error",
        summary="relay_outbox_orders_job failed: boom.",
        kind="run_failure",
        link=DagsterLinks().run("r1"),
        table="outbox_orders",
        job="relay_outbox_orders_job",
        run_id="r1",
    )
    body = alerts.announce_event(condition, now=at(0), webhook_url=http_sink.url)
    assert posted(http_sink) == [body]
    assert (body["kind"], body["job"], body["run_id"], body["status"]) == (
        "run_failure",
        "relay_outbox_orders_job",
        "r1",
        "firing",
    )
    assert "check" not in body


def test_settings_that_cannot_be_read_fire_one_alert_that_resolves_once_they_can(conn, http_sink, tmp_path):
    from outbox_pipelines.core.oncall.sweep import settings_condition
    from outbox_pipelines.core.settings import load_settings_or_problem

    bad = tmp_path / "outbox.toml"
    bad.write_text('[table.billing_outbox]\ndestination = "paper"\n')
    broken = load_settings_or_problem(env={}, path=bad)
    assert broken.tables == {} and "unknown top-level keys ['table']" in (broken.problem or "")
    [firing] = announce(conn, [settings_condition(broken)], now=at(0), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert (firing["status"], firing["severity"], firing["kind"]) == ("firing", "error", "settings")
    assert "no table is relayed" in firing["summary"] and "[tables.NAME]" in firing["summary"]
    assert announce(conn, [settings_condition(broken)], now=at(1), repeat_s=REPEAT, webhook_url=http_sink.url) == []
    bad.write_text('[tables.billing_outbox]\ndestination = "paper"\n')
    fixed = load_settings_or_problem(env={}, path=bad)
    [resolved] = announce(conn, [settings_condition(fixed)], now=at(2), repeat_s=REPEAT, webhook_url=http_sink.url)
    assert resolved["status"] == "resolved"
