"""Replay a tired person can run: `outbox-pipelines replay` lists what moves, refuses what cannot be right,
and every replay command that `outbox-pipelines status` prints runs as printed."""

import json
import shlex
from datetime import timedelta

import pytest

from outbox_pipelines.core.operations.replay import (
    KNOWN_ERROR_CODES,
    ReplayFilter,
    ReplayRefused,
    ReplayRow,
    markdown_table,
    parse_death_time,
    replay_dead,
)
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.rows import make_dead

EVENTS = "outbox_events"


def _dead(conn, ids, code, *, topic=None, when=None):
    for i in ids:
        conn.execute(
            "UPDATE outbox_events SET status = 'dead', attempts = 3, last_error_code = %s, last_error = 'boom', "
            "topic = coalesce(%s, topic), updated_at = coalesce(%s, now()) WHERE id = %s",
            (code, topic, when, i),
        )


def _snapshot(conn):
    return [(r["id"], r["status"], r["attempts"], r["last_error_code"]) for r in rows(conn, EVENTS)]


def test_dry_run_lists_the_rows_and_changes_nothing(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 4, topic="org.changed", prefix="ev-")
    _dead(conn, ids[:3], "BROKER_5XX")
    before = _snapshot(conn)
    audit_before = conn.execute("SELECT count(*) AS n FROM outbox_audit").fetchone()["n"]

    human = run_cli(cli_env, "replay", "--table", EVENTS, "--error-code", "BROKER_5XX", "--dry-run")
    assert human.returncode == 0, human.stderr
    out = human.stdout
    assert "filter: error_code=BROKER_5XX" in out
    assert "3 dead rows matched, would replay 3" in out
    header = next(line for line in out.splitlines() if "event_id" in line)
    assert all(col in header for col in ("id", "event_id", "topic", "error code", "died at"))
    for i, row_id in enumerate(ids[:3]):
        assert any(
            str(row_id) in line and f"ev-{i}" in line and "org.changed" in line and "BROKER_5XX" in line
            for line in out.splitlines()
        )
    assert "ev-3" not in out
    assert "dry run: nothing changed" in out
    assert f"outbox-pipelines replay --table {EVENTS} --error-code BROKER_5XX" in out

    machine = run_cli(cli_env, "replay", "--table", EVENTS, "--error-code", "BROKER_5XX", "--dry-run", "--json")
    assert machine.returncode == 0, machine.stderr
    report = json.loads(machine.stdout)
    assert (report["dry_run"], report["matched"], report["would_replay"], report["replayed"], report["refused"]) == (
        True,
        3,
        3,
        0,
        0,
    )
    assert report["filter"] == "error_code=BROKER_5XX"
    assert report["selection"]["error_code"] == "BROKER_5XX"
    assert report["replayed_ids"] == ids[:3]
    assert [r["id"] for r in report["rows"]] == ids[:3]
    first = report["rows"][0]
    assert {k: first[k] for k in ("event_id", "topic", "error_code")} == {
        "event_id": "ev-0",
        "topic": "org.changed",
        "error_code": "BROKER_5XX",
    }
    assert first["died_at"].endswith("Z")

    assert _snapshot(conn) == before
    assert conn.execute("SELECT count(*) AS n FROM outbox_audit").fetchone()["n"] == audit_before


def test_the_listing_says_why_each_row_died(cli_env, conn):
    """What died and why, from the terminal: each listed row's stored error, on one line in the table (cut at
    120 characters) and whole in --json."""
    ids = enqueue_n(conn, EVENTS, 3, topic="org.changed", prefix="why-")
    long_error = "HTTP 422: " + "field 'amount' " * 20
    handler_error = "log_org_changed: BAD_PAYLOAD: org.changed needs\norg_id"
    make_dead(conn, EVENTS, ids[:1], code="BAD_PAYLOAD", error=handler_error)
    make_dead(conn, EVENTS, ids[1:2], code="BROKER_4XX", error=long_error)
    make_dead(conn, EVENTS, ids[2:], code="BROKER_5XX", error=None)
    # A handler's own exception text is stored as it was raised: the listing masks credentials in it.
    secret_id = enqueue_n(conn, EVENTS, 1, topic="org.changed", prefix="cred-")
    leaky = "sync_crm: HTTPStatusError: 401 for url 'https://bot:s3cr3t-pw@crm.example/v1?api_key=K3Y-123'"
    make_dead(conn, EVENTS, secret_id, code="HANDLER_ERROR", error=leaky)

    human = run_cli(cli_env, "replay", "--table", EVENTS, "--all", "--dry-run")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert "last error" in next(line for line in lines if "event_id" in line)
    first = next(line for line in lines if "why-0" in line)
    assert first.endswith("log_org_changed: BAD_PAYLOAD: org.changed needs org_id"), first
    second = next(line for line in lines if "why-1" in line)
    assert second.endswith("…") and "HTTP 422: field 'amount'" in second and long_error.strip() not in second
    assert next(line for line in lines if "why-2" in line).endswith("-")

    listed_json = run_cli(cli_env, "replay", "--table", EVENTS, "--all", "--dry-run", "--json").stdout
    errors = {row["event_id"]: row["last_error"] for row in json.loads(listed_json)["rows"]}
    assert {key: errors[key] for key in ("why-0", "why-1", "why-2")} == {
        "why-0": handler_error,
        "why-1": long_error,
        "why-2": None,
    }
    for said in (human.stdout, listed_json):
        assert "s3cr3t-pw" not in said and "K3Y-123" not in said
    assert "crm.example" in errors["cred-0"] and "***" in errors["cred-0"]


def test_real_run_moves_the_rows_and_lists_them(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 3, topic="org.changed", prefix="mv-")
    _dead(conn, ids, "NETWORK_TIMEOUT")
    result = run_cli(cli_env, "replay", "--table", EVENTS, "--topic", "org.changed", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["dry_run"], report["matched"], report["replayed"]) == (False, 3, 3)
    assert [r["event_id"] for r in report["rows"]] == ["mv-0", "mv-1", "mv-2"]
    assert statuses(conn, EVENTS) == {"pending": 3}
    audited = conn.execute("SELECT count(*) AS n FROM outbox_audit WHERE code = 'outbox_replay'").fetchone()["n"]
    assert audited == 3

    _dead(conn, ids[:1], "NETWORK_TIMEOUT")
    human = run_cli(cli_env, "replay", "--table", EVENTS, "--id", str(ids[0]))
    assert human.returncode == 0, human.stderr
    assert f"filter: id in {ids[0]}" in human.stdout
    assert "replayed (1):" in human.stdout and "mv-0" in human.stdout
    assert statuses(conn, EVENTS) == {"pending": 3}


def test_bad_request_rows_are_listed_as_refused_unless_forced(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 2, prefix="br-")
    _dead(conn, ids, "BAD_REQUEST")
    dry = run_cli(cli_env, "replay", "--table", EVENTS, "--all", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "filter: all dead rows (no filter)" in dry.stdout
    assert "refused, died of BAD_REQUEST (2; --force replays them)" in dry.stdout and "br-1" in dry.stdout
    real = run_cli(cli_env, "replay", "--table", EVENTS, "--all")
    assert real.returncode == 0 and statuses(conn, EVENTS) == {"dead": 2}
    forced = run_cli(cli_env, "replay", "--table", EVENTS, "--all", "--force", "--json")
    assert json.loads(forced.stdout)["replayed_ids"] == ids
    assert statuses(conn, EVENTS) == {"pending": 2}


def test_no_filter_is_refused_and_touches_nothing(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 2)
    _dead(conn, ids, "BROKER_5XX")
    for extra in ([], ["--dry-run"], ["--force"]):
        result = run_cli(cli_env, "replay", "--table", EVENTS, *extra)
        assert result.returncode == 2
        assert "--all" in result.stderr and "Traceback" not in result.stderr
    assert statuses(conn, EVENTS) == {"dead": 2}


def test_error_code_is_case_insensitive(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 3)
    _dead(conn, ids[:2], "BAD_REQUEST")
    _dead(conn, ids[2:], "BROKER_5XX")
    result = run_cli(cli_env, "replay", "--table", EVENTS, "--error-code", "bad_request", "--force", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["matched"], report["replayed_ids"], report["filter"]) == (2, ids[:2], "error_code=BAD_REQUEST")
    assert statuses(conn, EVENTS) == {"pending": 2, "dead": 1}


def test_unknown_error_code_is_refused_with_the_known_ones(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 2)
    _dead(conn, ids[:1], "BROKER_5XX")
    _dead(conn, ids[1:], "Bad_Payload")  # a handler's own code: accepted because dead rows carry it
    result = run_cli(cli_env, "replay", "--table", EVENTS, "--error-code", "BROKER_500", "--dry-run")
    assert result.returncode == 2
    assert "'BROKER_500' is unknown" in result.stderr
    assert all(code in result.stderr for code in KNOWN_ERROR_CODES)
    assert "Bad_Payload" in result.stderr and "Traceback" not in result.stderr
    custom = run_cli(cli_env, "replay", "--table", EVENTS, "--error-code", "BAD_PAYLOAD", "--json")
    assert custom.returncode == 0, custom.stderr
    assert json.loads(custom.stdout)["replayed_ids"] == [ids[1]]
    assert statuses(conn, EVENTS) == {"pending": 1, "dead": 1}


def test_bad_id_and_bad_times_exit_2_with_a_message(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 1)
    _dead(conn, ids, "BROKER_5XX")
    too_big = run_cli(cli_env, "replay", "--table", EVENTS, "--id", "99999999999999999999")
    assert too_big.returncode == 2
    assert "does not fit a row id" in too_big.stderr and "Traceback" not in too_big.stderr
    not_a_number = run_cli(cli_env, "replay", "--table", EVENTS, "--id", "seven")
    assert not_a_number.returncode == 2 and "is not a row id" in not_a_number.stderr
    bad_time = run_cli(cli_env, "replay", "--table", EVENTS, "--since", "04:14")
    assert bad_time.returncode == 2
    assert 'since="04:14" is not a time: use ISO 8601 like 2026-11-21T10:00:00Z' in bad_time.stderr
    backwards = run_cli(cli_env, "replay", "--table", EVENTS, "--since", "2026-11-22", "--until", "2026-11-21")
    assert backwards.returncode == 2 and "must be before until" in backwards.stderr
    assert statuses(conn, EVENTS) == {"dead": 1}


def test_since_until_take_iso_dates_and_times_ago(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 3, prefix="t-")
    now = db_now(conn)
    _dead(conn, ids[:1], "BROKER_5XX", when=now - timedelta(days=3))
    _dead(conn, ids[1:2], "BROKER_5XX", when=now - timedelta(hours=5))
    _dead(conn, ids[2:], "BROKER_5XX", when=now - timedelta(minutes=10))

    def listed(*args):
        result = run_cli(cli_env, "replay", "--table", EVENTS, *args, "--dry-run", "--json")
        assert result.returncode == 0, result.stderr
        return [r["event_id"] for r in json.loads(result.stdout)["rows"]]

    assert listed("--since", "2h") == ["t-2"]
    assert listed("--since", "1d", "--until", "30m") == ["t-1"]
    assert listed("--until", (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")) == ["t-0"]
    assert listed("--since", (now - timedelta(days=4)).date().isoformat()) == ["t-0", "t-1", "t-2"]
    echoed = run_cli(cli_env, "replay", "--table", EVENTS, "--since", "2h", "--dry-run")
    assert echoed.returncode == 0, echoed.stderr
    filter_line = echoed.stdout.splitlines()[0]
    assert filter_line.startswith("filter: died at or after 20") and filter_line.endswith("Z (2h ago)")


def test_status_suggestions_run_as_printed(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 4)
    _dead(conn, ids[:2], "BROKER_5XX")
    _dead(conn, ids[2:3], "custom code")  # spaces: the printed command must quote it
    order_ids = enqueue_n(conn, "outbox_orders", 1)
    make_dead(conn, "outbox_orders", order_ids[0], code=None)
    status = run_cli(cli_env, "status")
    assert status.returncode == 0, status.stderr
    printed = [line.strip() for line in status.stdout.splitlines() if line.strip().startswith("outbox-pipelines ")]
    assert f"outbox-pipelines replay --table {EVENTS} --error-code BROKER_5XX --dry-run" in printed
    assert f"outbox-pipelines replay --table {EVENTS} --all --dry-run" in printed
    assert "outbox-pipelines replay --table outbox_orders --error-code UNKNOWN --dry-run" in printed
    before = statuses(conn, EVENTS)
    for command in printed:
        argv = shlex.split(command)
        result = run_cli(cli_env, *argv[1:])
        assert result.returncode == 0, f"{command}: {result.stderr}"
        assert "would replay" in result.stdout
        assert "no dead rows match" not in result.stdout, command
    assert statuses(conn, EVENTS) == before


def test_dry_run_then_pasted_command_replays_the_same_rows(cli_env, conn):
    ids = enqueue_n(conn, EVENTS, 2)
    _dead(conn, ids, "UNAUTHORIZED")
    dry = run_cli(
        cli_env, "replay", "--table", EVENTS, "--error-code", "unauthorized", "--since", "1h",
        "--reason", "key rotated", "--dry-run",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    command = lines[lines.index("dry run: nothing changed. To replay these rows, run:") + 1].strip()
    assert "--dry-run" not in command and "--since 20" in command  # the time as applied, not "1h"
    assert "--reason 'key rotated'" in command  # the reason goes with the rows into the audit
    assert conn.execute("SELECT count(*) AS n FROM outbox_audit WHERE code = 'outbox_replay'").fetchone()["n"] == 0
    result = run_cli(cli_env, *shlex.split(command)[1:])
    assert result.returncode == 0, result.stderr
    assert statuses(conn, EVENTS) == {"pending": 2}
    details = conn.execute("SELECT detail FROM outbox_audit WHERE code = 'outbox_replay'").fetchall()
    assert [d["detail"] for d in details] == ["replayed: key rotated (it had died of: boom)"] * 2


def test_core_refuses_an_empty_filter_and_unknown_codes_before_changing_anything(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 1)
    _dead(conn, ids, "BROKER_5XX")
    with pytest.raises(ReplayRefused, match="needs a filter"):
        replay_dead(db_url, EVENTS, ReplayFilter())
    with pytest.raises(ReplayRefused, match="unknown"):
        replay_dead(db_url, EVENTS, ReplayFilter(error_code="NOPE"))
    assert statuses(conn, EVENTS) == {"dead": 1}
    report = replay_dead(db_url, EVENTS, ReplayFilter(), allow_all=True, dry_run=True)
    assert (report.matched, report.replayed_ids, report.filter) == (1, ids, "all dead rows (no filter)")


def test_reports_list_the_first_hundred_and_count_all(db_url, conn):
    ids = enqueue_n(conn, EVENTS, 130)
    _dead(conn, ids, "BROKER_5XX")
    report = replay_dead(db_url, EVENTS, ReplayFilter(error_code="broker_5xx"), dry_run=True, batch_size=50)
    assert (report.matched, report.would_replay, len(report.rows), len(report.replayed_ids)) == (130, 130, 100, 130)
    assert "… and 30 more (first 100 of 130 listed)" in report.rows_markdown()


@pytest.mark.parametrize("text", ["04:14", "yesterday", "2026-13-01", "2h from now", ""])
def test_bad_times_name_the_field_and_the_format(text):
    with pytest.raises(ReplayRefused) as caught:
        parse_death_time(text, "until")
    assert str(caught.value).startswith(f'until="{text}" is not a time: use ISO 8601 like 2026-11-21T10:00:00Z')


def test_the_markdown_table_shows_an_error_as_code_never_rendered():
    """What a destination answered goes into Dagster's metadata as code: no link or image of theirs renders."""
    row = ReplayRow(7, "ev-7", "t", None, "BAD_REQUEST", None, "HTTP 400: '![x](http://e.example/t.png) | `tick`'")
    table = markdown_table([row], 1)
    assert table.splitlines()[-1].endswith("| `HTTP 400: '![x](http://e.example/t.png) \\| 'tick''` |"), table
