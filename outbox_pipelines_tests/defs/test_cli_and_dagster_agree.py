"""One rule, two front ends (issue 27): ``outbox-pipelines clean`` and ``clean_job`` run the core's ``clean_tables``,
``outbox-pipelines replay`` and ``replay_dead_job`` the core's ``check_filter``. The same request gives the same
rows deleted, the same refusal and the same skip from either; a filterless replay is refused in the same words.

Each front end runs against a database of its own, seeded alike, so what one deletes cannot hide what the other would.
"""

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox_pipelines.core.operations.maintenance import CLEANER_DISABLED
from outbox_pipelines.core.operations.replay import NEEDS_A_FILTER
from outbox_pipelines.defs.common import REFUSED_INPUT
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.defs.conftest import op_metadata, run_job
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.rows import make_dead, make_sent
from outbox_pipelines_tests.scratch import DEMO_PARTS

EVENTS, MEMORY = "outbox_events", "outbox_memory"
CLEANER_OFF_FOR_MEMORY = f"{DEMO_PARTS}[tables.{MEMORY}]\ncleaner_enabled = false\n"


@pytest.fixture
def two_databases(pg_server) -> Iterator[tuple[str, str]]:
    """(the CLI's database, Dagster's database): fresh clones of the migrated template."""
    (cli_name, cli_url), (dagster_name, dagster_url) = pg_server.create_database(), pg_server.create_database()
    yield cli_url, dagster_url
    pg_server.drop_database(cli_name)
    pg_server.drop_database(dagster_name)


def _seed(url: str) -> None:
    """Old and fresh sent rows in two tables, a pending row, an expired and a live ledger row, an old audit row."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        enqueue_n(conn, EVENTS, 4, prefix="ev-")
        make_sent(conn, EVENTS, event_ids=["ev-0", "ev-1"], age=timedelta(days=30))
        make_sent(conn, EVENTS, event_ids=["ev-2"])
        enqueue_n(conn, MEMORY, 2, prefix="mem-")
        make_sent(conn, MEMORY, age=timedelta(days=30))
        conn.execute(
            "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) VALUES "
            "('old', 'sha256:a', now() - interval '1 minute'), "
            "('fresh', 'sha256:b', now() + interval '1 day')"
        )
        conn.execute(
            "INSERT INTO outbox_audit (outbox_table, code, worker, created_at) "
            f"VALUES ('{EVENTS}', 'outbox_claim', 'w', now() - interval '40 days')"
        )


def _kept(url: str) -> dict[str, object]:
    """What is left: each table's event ids by status, the ledger's keys, audit rows older than 30 days."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        left: dict[str, object] = {
            table: sorted((r["event_id"], r["status"]) for r in conn.execute(f"SELECT event_id, status FROM {table}"))
            for table in (EVENTS, MEMORY)
        }
        left["ledger"] = sorted(r["idempotency_key"] for r in conn.execute("SELECT idempotency_key FROM idempo_ledger"))
        left["old_audit"] = conn.execute(
            "SELECT count(*) AS n FROM outbox_audit WHERE created_at < now() - interval '30 days'"
        ).fetchone()["n"]
        return left


def _cli_env(base: dict[str, str], url: str, config: str) -> dict[str, str]:
    return {**base, "OUTBOX_DATABASE_URL": url, "OUTBOX_CONFIG": config}


def _dagster_refusal(result) -> tuple[str, str]:
    """(the sentence the run shows, the field it names) of a refused launch."""
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failure.event_specific_data.user_failure_data
    assert data is not None, failure.event_specific_data.error
    return data.description, data.metadata[REFUSED_INPUT].value


def _user_logs(instance, result) -> list[str]:
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def test_clean_deletes_the_same_rows_and_skips_the_same_table_from_the_cli_and_dagster(
    two_databases, cli_env, instance, tmp_path
):
    cli_url, dagster_url = two_databases
    config = tmp_path / "outbox.toml"
    config.write_text(CLEANER_OFF_FOR_MEMORY)
    for url in two_databases:
        _seed(url)

    cli = run_cli(
        _cli_env(cli_env, cli_url, str(config)),
        "clean",
        "--table",
        EVENTS,
        "--table",
        MEMORY,
        "--audit-retention",
        "30d",
    )
    assert cli.returncode == 0, cli.stderr
    dagster = run_job(
        "clean_job",
        outbox_resources(url=dagster_url, config_path=str(config)),
        instance,
        {"ops": {"clean_op": {"config": {"tables": [EVENTS, MEMORY], "audit_retention": "30d"}}}},
    )
    assert dagster.success

    assert (
        _kept(cli_url)
        == _kept(dagster_url)
        == {
            EVENTS: [("ev-2", "sent"), ("ev-3", "pending")],  # the old sent rows went; a fresh one and a pending stay
            MEMORY: [("mem-0", "sent"), ("mem-1", "sent")],  # its cleaner is off: skipped by both
            "ledger": ["fresh"],
            "old_audit": 0,
        }
    )
    skipped = f"{MEMORY}: {CLEANER_DISABLED}"
    assert skipped in cli.stdout and any(skipped in line for line in _user_logs(instance, dagster))
    meta = op_metadata(dagster, "clean_op")
    assert meta["deleted_sent_by_table"] == {EVENTS: 2}  # the skipped table is not among the cleaned
    assert f"{EVENTS}: deleted 2 sent rows older than 7 d" in cli.stdout
    assert (meta["deleted_expired_by_table"], meta["deleted_audit"]) == ({"idempo_ledger": 1}, 1)
    assert "idempo_ledger: deleted 1 expired rows; outbox_audit: deleted 1 old rows" in cli.stdout


def test_clean_refuses_a_too_short_retention_in_the_same_words_from_the_cli_and_dagster(
    two_databases, cli_env, instance, tmp_path
):
    cli_url, dagster_url = two_databases
    config = tmp_path / "outbox.toml"
    config.write_text(DEMO_PARTS)
    for url in two_databases:
        _seed(url)
    before = _kept(cli_url)

    cli = run_cli(
        _cli_env(cli_env, cli_url, str(config)), "clean", "--table", MEMORY, "--table", EVENTS, "--retention", "30m"
    )
    assert cli.returncode == 2, cli.stderr
    dagster = run_job(
        "clean_job",
        outbox_resources(url=dagster_url, config_path=str(config)),
        instance,
        {"ops": {"clean_op": {"config": {"tables": [MEMORY, EVENTS], "retention": "30m"}}}},
    )
    message, field = _dagster_refusal(dagster)

    # The first table over the limit names the refusal; nothing was deleted from any table, nor the shared ones.
    assert field == "retention" and message.startswith(f"retention: {MEMORY}: a retention of 30 min is shorter")
    [cli_error] = [line for line in cli.stderr.splitlines() if line.startswith("error: ")]
    assert cli_error.removeprefix("error: ") == message.removeprefix("retention: ")
    assert "--force / force: true" in message
    assert _kept(cli_url) == _kept(dagster_url) == before


def test_a_disabled_cleaner_is_skipped_without_a_retention_check_and_force_cleans_it_from_either(
    two_databases, cli_env, instance, tmp_path
):
    """A retention too short for a table whose cleaner is off refuses nothing (the table loses nothing); force
    cleans that table too (and then accepts the short retention) from either front end."""
    cli_url, dagster_url = two_databases
    config = tmp_path / "outbox.toml"
    config.write_text(CLEANER_OFF_FOR_MEMORY)
    resources = outbox_resources(url=dagster_url, config_path=str(config))
    for url in two_databases:
        _seed(url)

    def both(*cli_extra: str, **dagster_extra: object) -> None:
        cli = run_cli(
            _cli_env(cli_env, cli_url, str(config)),
            "clean",
            "--table",
            EVENTS,
            "--table",
            MEMORY,
            "--retention",
            "2h",
            *cli_extra,
        )  # 2h: past outbox_events' horizon, short of outbox_memory's
        assert cli.returncode == 0, cli.stderr
        dagster = run_job(
            "clean_job",
            resources,
            instance,
            {"ops": {"clean_op": {"config": {"tables": [EVENTS, MEMORY], "retention": "2h", **dagster_extra}}}},
        )
        assert dagster.success

    both()
    assert _kept(cli_url) == _kept(dagster_url)
    assert _kept(cli_url)[MEMORY] == [("mem-0", "sent"), ("mem-1", "sent")]
    both("--force", force=True)
    assert _kept(cli_url) == _kept(dagster_url)
    assert _kept(cli_url)[MEMORY] == []


def test_a_replay_without_a_filter_is_refused_in_the_same_words_by_the_cli_and_dagster(
    conn, cli_env, instance, resources
):
    enqueue_n(conn, EVENTS, 2)
    make_dead(conn, EVENTS, code="BROKER_5XX")

    cli = run_cli(cli_env, "replay", "--table", EVENTS)
    dagster = run_job(
        "replay_dead_job",
        resources,
        instance,
        {"ops": {"replay_dead_op": {"config": {"table": EVENTS, "dry_run": False}}}},
    )

    assert cli.returncode == 2
    message, field = _dagster_refusal(dagster)
    assert field == "filter"
    assert cli.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert message == f"{NEEDS_A_FILTER} Nothing was touched."
    assert statuses(conn, EVENTS) == {"dead": 2}


def test_a_replays_reason_is_audited_alike_from_the_cli_and_dagster_and_refused_alike(
    conn, cli_env, instance, resources
):
    """``replay --reason`` and ``replay_dead_job``'s ``reason`` go through the core's one rule: kept in the audit row
    before the error the message died of; a reason that is not one printable line is refused by both."""
    by_cli, by_dagster = enqueue_n(conn, EVENTS, 2, prefix="why-")
    make_dead(conn, EVENTS, [by_cli, by_dagster], code="BROKER_5XX", error="HTTP 503 from the broker")

    assert run_cli(cli_env, "replay", "--table", EVENTS, "--id", str(by_cli), "--reason", "INC-7 fixed").returncode == 0
    config = {"table": EVENTS, "ids": [by_dagster], "dry_run": False, "reason": "INC-7 fixed"}
    assert run_job("replay_dead_job", resources, instance, {"ops": {"replay_dead_op": {"config": config}}}).success

    audit = conn.execute(
        "SELECT message_id, detail, error_code FROM outbox_audit WHERE code = 'outbox_replay' ORDER BY message_id"
    ).fetchall()
    expected = "replayed: INC-7 fixed (it had died of: HTTP 503 from the broker)"
    assert [(a["message_id"], a["detail"], a["error_code"]) for a in audit] == [
        (by_cli, expected, "BROKER_5XX"),
        (by_dagster, expected, "BROKER_5XX"),
    ]

    make_dead(conn, EVENTS, [by_cli, by_dagster], code="BROKER_5XX")
    cli = run_cli(cli_env, "replay", "--table", EVENTS, "--all", "--reason", "INC-8\nrm -rf")
    assert cli.returncode == 2 and "--reason" in cli.stderr and "newline" in cli.stderr, cli.stderr
    refused = {"table": EVENTS, "all": True, "dry_run": False, "reason": "INC-8\x1b[2J"}
    message, field = _dagster_refusal(
        run_job("replay_dead_job", resources, instance, {"ops": {"replay_dead_op": {"config": refused}}})
    )
    assert field == "reason" and "printable" in message, message
    assert statuses(conn, EVENTS) == {"dead": 2}
