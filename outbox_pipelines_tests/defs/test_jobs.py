"""Every job in-process against a real PostgreSQL (and a local HTTP sink where it delivers)."""

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.defs.conftest import op_metadata, orders_sent_to, run_job, run_relay_job_declaring
from outbox_pipelines_tests.helpers import db_now, enqueue_n, rows, statuses
from outbox_pipelines_tests.rows import make_dead, make_sent, make_stuck
from outbox_pipelines_tests.scratch import DEMO_PARTS

REPO = Path(__file__).resolve().parents[2]


def test_definitions_load_and_validate(tmp_path):
    import os

    from outbox_pipelines.definitions import defs

    names = {job.name for job in defs.jobs}
    assert {
        "relay_group_default_job",
        "relay_job",
        "requeue_stuck_job",
        "clean_job",
        "replay_dead_job",
        "skip_dead_job",
        "backfill_job",
        "outbox_checks_job",
        "prune_run_history_job",
    } <= names
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert "All code locations passed validation" in result.stderr + result.stdout


def test_relay_job_sends_and_records_metadata(db_url, conn, instance, http_sink, tmp_path):
    enqueue_n(conn, "outbox_orders", 20, prefix="o-")
    resources = orders_sent_to(tmp_path, db_url, http_sink.url)
    result = run_job(
        "relay_job",
        resources,
        instance,
        {"ops": {"relay_table": {"config": {"table": "outbox_orders", "max_seconds": 1.0}}}},
    )
    assert result.success
    meta = op_metadata(result, "relay_table")
    assert (meta["sent"], meta["retried"], meta["dead"], meta["conflicts"]) == (20, 0, 0, 0)
    assert meta["throughput_per_s"] > 0 and "lag_p95_s" in meta
    assert statuses(conn, "outbox_orders") == {"sent": 20}
    assert len(http_sink.received) == 20
    observations = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert observations and observations[0].asset_key == dg.AssetKey(["outbox", "outbox_orders"])


def test_a_once_relay_run_drains_a_keyed_backlog_whose_first_batch_holds_every_key(db_url, conn, instance, resources):
    """A Dagster relay run with ``once`` ends when nothing is ready, and a key's next message is ready once the one
    before it is sent: 100 keys of 3 messages, the first batch of 100 every key's first, all 300 go in one run (the
    run ended with 100 sent: the claim beside that batch's commit found nothing)."""
    messages = [
        Message(topic="t", payload={"key": k, "n": n}, event_id=f"key{k}-{n}", ordering_key=f"key{k}")
        for n in range(3)
        for k in range(100)
    ]
    Outbox("outbox_memory").enqueue_many(conn, messages, outside_transaction=True)
    result = run_job(
        "relay_job", resources, instance, {"ops": {"relay_table": {"config": {"table": "outbox_memory", "once": True}}}}
    )
    assert result.success
    assert op_metadata(result, "relay_table")["sent"] == 300
    assert statuses(conn, "outbox_memory") == {"sent": 300}


def test_relay_job_with_an_unknown_table_fails_clearly_and_touches_nothing(db_url, conn, instance, resources):
    """A typo starts no run (the table is one of the code location's: test_launchpads.py); a table the location
    still offers that the settings no longer declare fails the run, naming it."""
    enqueue_n(conn, "outbox_orders", 2)
    config = {"ops": {"relay_table": {"config": {"table": "nope_outbox"}}}}
    result = run_relay_job_declaring(["nope_outbox", "outbox_orders"], resources, instance, config)
    assert not result.success
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "no settings for table 'nope_outbox'" in failure.event_specific_data.error.message
    assert statuses(conn, "outbox_orders") == {"pending": 2}


# relay, replay, skip and backfill cannot be launched without a table (a Dagster Enum): test_launchpads.py.
def test_a_launch_that_names_no_table_names_the_projects_tables_and_touches_nothing(db_url, conn, instance, resources):
    """No generic job defaults to a table: a code location that declared none (its settings unreadable as it
    loaded) takes any text, and a launch without one says which tables the project has now."""
    enqueue_n(conn, "outbox_orders", 2)
    result = run_relay_job_declaring([], resources, instance, {"ops": {"relay_table": {"config": {}}}})
    assert not result.success
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert (
        "table: name the outbox table; this project's are: outbox_events, outbox_members, outbox_memory, outbox_orders"
        in failure.event_specific_data.error.message
    )
    assert statuses(conn, "outbox_orders") == {"pending": 2}


def test_relay_job_with_the_destination_down_loses_nothing(db_url, conn, instance, tmp_path):
    enqueue_n(conn, "outbox_orders", 5)
    resources = orders_sent_to(tmp_path, db_url, "http://127.0.0.1:9/orders")
    result = run_job(
        "relay_job",
        resources,
        instance,
        {"ops": {"relay_table": {"config": {"table": "outbox_orders", "max_seconds": 0.5}}}},
    )
    assert result.success
    meta = op_metadata(result, "relay_table")
    assert (meta["sent"], meta["retried"]) == (0, 5)
    assert statuses(conn, "outbox_orders") == {"pending": 5}
    # Port 9 on 127.0.0.1 refuses: the code says so (not a timeout).
    assert {r["last_error_code"] for r in rows(conn, "outbox_orders")} == {"CONNECTION_REFUSED"}


def test_requeue_and_clean_jobs_report_what_they_changed(db_url, conn, instance, resources):
    ids = enqueue_n(conn, "outbox_events", 3)
    make_stuck(conn, "outbox_events", ids[0])
    make_sent(conn, "outbox_events", ids[1], age=timedelta(days=30))
    result = run_job("requeue_stuck_job", resources, instance)
    assert result.success and op_metadata(result, "requeue_stuck_op")["requeued_total"] == 1
    result = run_job("clean_job", resources, instance)
    assert result.success and op_metadata(result, "clean_op")["deleted_sent_total"] == 1
    assert statuses(conn, "outbox_events") == {"pending": 2}


def test_clean_job_cleans_the_shared_tables_once_even_when_the_first_tables_cleaner_is_off(
    db_url, conn, instance, tmp_path
):
    config = tmp_path / "outbox.toml"
    config.write_text(
        DEMO_PARTS + "[tables.outbox_events]\ncleaner_enabled = false\n"
    )  # the first table, sorted by name
    conn.execute(
        "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) VALUES "
        "('old', 'sha256:a', now() - interval '1 minute'), ('fresh', 'sha256:b', now() + interval '1 day')"
    )
    resources = outbox_resources(url=db_url, config_path=str(config))
    result = run_job("clean_job", resources, instance)
    assert result.success
    meta = op_metadata(result, "clean_op")
    assert meta["deleted_expired_by_table"] == {"idempo_ledger": 1}
    assert "outbox_events" not in meta["deleted_sent_by_table"]
    assert [r["idempotency_key"] for r in conn.execute("SELECT idempotency_key FROM idempo_ledger")] == ["fresh"]


def test_clean_job_with_the_cleaner_switched_off_everywhere_deletes_nothing(db_url, conn, instance, monkeypatch):
    monkeypatch.setenv("OUTBOX_CLEANER_ENABLED", "false")
    conn.execute(
        "INSERT INTO idempo_ledger (idempotency_key, request_digest, expires_at) VALUES "
        "('old', 'sha256:a', now() - interval '1 minute')"
    )
    resources = outbox_resources(url=db_url)
    result = run_job("clean_job", resources, instance)
    assert result.success
    assert not any(op_metadata(result, "clean_op")["deleted_expired_by_table"].values())
    assert conn.execute("SELECT count(*) AS n FROM idempo_ledger").fetchone()["n"] == 1


def test_replay_job_dry_run_by_default_then_replays(db_url, conn, instance, resources):
    ids = enqueue_n(conn, "outbox_orders", 3)
    make_dead(conn, "outbox_orders", ids[:2], code="BROKER_5XX")
    make_dead(conn, "outbox_orders", ids[2], code="BAD_REQUEST")
    config = {"ops": {"replay_dead_op": {"config": {"table": "outbox_orders", "all": True}}}}
    dry = op_metadata(run_job("replay_dead_job", resources, instance, config), "replay_dead_op")
    assert (dry["dry_run"], dry["matched"], dry["replayed"], dry["refused_bad_request"]) == (True, 3, 0, 1)
    assert statuses(conn, "outbox_orders") == {"dead": 3}
    config["ops"]["replay_dead_op"]["config"]["dry_run"] = False
    done = op_metadata(run_job("replay_dead_job", resources, instance, config), "replay_dead_op")
    assert done["replayed_ids"] == ids[:2]
    assert statuses(conn, "outbox_orders") == {"pending": 2, "dead": 1}
    config["ops"]["replay_dead_op"]["config"].update({"topic": "nothing-matches"})
    none = op_metadata(run_job("replay_dead_job", resources, instance, config), "replay_dead_op")
    assert none["matched"] == 0


def test_skip_job_passes_over_a_parked_head_after_a_dry_run(db_url, conn, instance, resources):
    outbox = Outbox("outbox_events")
    first, second = (
        outbox.enqueue(conn, Message(topic="t", payload={"n": n}, ordering_key="org-42"), outside_transaction=True).id
        for n in (1, 2)
    )
    make_dead(conn, "outbox_events", first, code="BAD_REQUEST")
    config = {"ops": {"skip_dead_op": {"config": {"table": "outbox_events", "ordering_key": "org-42"}}}}
    dry = op_metadata(run_job("skip_dead_job", resources, instance, config), "skip_dead_op")
    assert (dry["dry_run"], dry["matched"], dry["skipped"], dry["keys"]) == (True, 1, 0, "org-42")
    config["ops"]["skip_dead_op"]["config"]["dry_run"] = False
    done = op_metadata(run_job("skip_dead_job", resources, instance, config), "skip_dead_op")
    assert done["skipped"] == 1
    assert [r["id"] for r in conn.execute("SELECT id FROM outbox_events WHERE ordering_blocked")] == []
    assert second in [m.id for m in OutboxTable(conn, "outbox_events").claim("w", 10, 30)]
    nothing = run_job(
        "skip_dead_job", resources, instance, {"ops": {"skip_dead_op": {"config": {"table": "outbox_events"}}}}
    )
    assert not nothing.success


def test_backfill_job_redelivers_one_day_with_the_same_keys(db_url, conn, instance, http_sink, monkeypatch):
    monkeypatch.setenv("OUTBOX_BROKER_URL", http_sink.url)  # outbox_orders' own destination
    ids = enqueue_n(conn, "outbox_orders", 4, prefix="bf-")
    today = db_now(conn).date()
    make_sent(conn, "outbox_orders", ids[:3])
    make_sent(conn, "outbox_orders", ids[3], age=timedelta(days=3))
    resources = outbox_resources(url=db_url)
    config = {"ops": {"backfill_op": {"config": {"table": "outbox_orders", "dry_run": False}}}}
    result = run_job("backfill_job", resources, instance, config, partition_key=today.isoformat())
    assert result.success
    meta = op_metadata(result, "backfill_op")
    assert (meta["found"], meta["delivered"], meta["failed"]) == (3, 3, 0)
    assert sorted(http_sink.keys()) == ["bf-0", "bf-1", "bf-2"]
    empty = run_job("backfill_job", resources, instance, config, partition_key="2026-01-02")
    assert empty.success and op_metadata(empty, "backfill_op")["found"] == 0


def test_prune_run_history_job_deletes_old_runs_of_the_outbox_s_jobs_only(db_url, instance, resources):
    """A team's own job shares the instance (and the code location): its runs keep their history, unless the
    operator asks for every job's (every_job, for an instance only the outbox uses)."""

    @dg.op
    def team_op() -> None:
        pass

    @dg.job
    def team_job() -> None:
        team_op()

    team_job.execute_in_process(instance=instance)
    run_job("clean_job", resources, instance)
    assert len(instance.get_runs()) == 2
    prune = {"ops": {"prune_run_history_op": {"config": {"keep_days": -1}}}}
    result = run_job("prune_run_history_job", resources, instance, prune)
    assert result.success and op_metadata(result, "prune_run_history_op")["deleted_runs"] == 1
    assert sorted(r.job_name for r in instance.get_runs()) == ["prune_run_history_job", "team_job"]
    prune["ops"]["prune_run_history_op"]["config"]["every_job"] = True
    every = run_job("prune_run_history_job", resources, instance, prune)
    assert every.success and op_metadata(every, "prune_run_history_op")["deleted_runs"] == 2
    assert [r.job_name for r in instance.get_runs()] == ["prune_run_history_job"]


def test_a_broker_password_never_reaches_dagster_run_logs_metadata_or_alerts(
    db_url, conn, instance, http_sink, monkeypatch, tmp_path
):
    """Broker credentials in the URL: sent as Basic auth, shown nowhere a person reads."""
    monkeypatch.setenv("OUTBOX_ALERT_WEBHOOK_URL", http_sink.url)
    enqueue_n(conn, "outbox_orders", 3)
    secret_url = http_sink.url.replace("http://", "http://brokeruser:BrokerPw-dagster@") + "orders"
    down_url = "http://brokeruser:BrokerPw-dagster@127.0.0.1:9/orders"
    texts = []
    for url in (secret_url, down_url):
        monkeypatch.setenv("ORDERS_BROKER_URL", url)  # a credential comes from the deployment's environment
        resources = orders_sent_to(tmp_path, db_url, url, url_env="ORDERS_BROKER_URL")
        result = run_job(
            "relay_job",
            resources,
            instance,
            {"ops": {"relay_table": {"config": {"table": "outbox_orders", "max_seconds": 1.0}}}},
        )
        assert result.success
        for record in instance.all_logs(result.run_id):
            texts.append(record.message or "")
            texts.append(repr(record.dagster_event.event_specific_data) if record.dagster_event else "")
    from outbox_pipelines.core.oncall.sweep import sweep
    from outbox_pipelines.core.settings import load_settings

    conn.execute("UPDATE outbox_destination_health SET failing_since = now() - interval '10 minutes'")
    alerts = sweep(db_url, load_settings(env={}, path=None)).alerts
    texts += [str(a) for a in alerts]
    assert any("destination" == a.get("check") for a in alerts)  # the outage was told...
    assert any("http://127.0.0.1:9" in t for t in texts)  # ...and the destination named by its origin
    assert not [t for t in texts if "BrokerPw-dagster" in t]
    orders = [r for r in http_sink.received if r.key]  # the webhook's alerts carry no Idempotency-Key
    assert len(orders) == 3 and all(r.headers.get("Authorization", "").startswith("Basic ") for r in orders)


def test_a_second_stop_while_the_relay_settles_does_not_cut_the_wait_short():
    """A repeated Terminate (or Ctrl-C twice) lands while the op waits for the relay's settle: it keeps waiting."""
    import os
    import signal
    import threading

    from outbox_pipelines.defs.relay import _wait_through_interrupts

    settled = threading.Event()
    interrupts = 0

    def interrupt_twice_then_settle() -> None:
        nonlocal interrupts
        for _ in range(2):
            time.sleep(0.2)  # the main thread is waiting by then
            os.kill(os.getpid(), signal.SIGINT)  # raised as KeyboardInterrupt in the main thread
            interrupts += 1
        settled.set()

    threading.Thread(target=interrupt_twice_then_settle).start()
    _wait_through_interrupts(settled)
    assert settled.is_set() and interrupts == 2


@pytest.mark.parametrize(
    "resource_config",
    [
        {"outbox_destinations": {"config": {"url_overrides": {"outbox_memory": "{sink}"}}}},
        {"outbox_db": {"config": {"url": "postgresql://attacker@127.0.0.1:9/stolen"}}},
        {"outbox_db": {"config": {"config_path": "/tmp/attacker-outbox.toml"}}},
    ],
)
def test_a_launch_cannot_choose_where_messages_go_or_which_database(db_url, conn, instance, http_sink, resource_config):
    """Issue 22: the launchpad (the UI has no login) sent a paper table's messages, with the broker's bearer
    token, to a URL of the launcher's choosing, and marked them sent. Where messages go, and with which
    credential, is the deployment's: the resources take no run config at all."""
    from outbox_pipelines.definitions import build_definitions

    enqueue_n(conn, "outbox_memory", 3)
    config = json.loads(json.dumps(resource_config).replace("{sink}", http_sink.url))
    job = build_definitions(outbox_resources(url=db_url)).resolve_job_def("relay_job")
    with pytest.raises(dg.DagsterInvalidConfigError, match="unexpected config entry"):
        job.execute_in_process(
            instance=instance,
            run_config={
                "resources": config,
                "ops": {"relay_table": {"config": {"table": "outbox_memory", "once": True}}},
            },
        )
    assert http_sink.received == []
    assert statuses(conn, "outbox_memory") == {"pending": 3}


# -- relay groups (issue 23) --------------------------------------------------------------------------------


def test_a_group_run_relays_every_table_of_its_group_and_observes_each(db_url, conn, instance, resources):
    enqueue_n(conn, "outbox_events", 4, topic="org.changed", payload=lambda i: {"org_id": i})
    enqueue_n(conn, "outbox_memory", 3)
    result = run_job(
        "relay_group_default_job",
        resources,
        instance,
        {"ops": {"relay_group": {"config": {"group": "default", "once": True}}}},
    )
    assert result.success
    assert statuses(conn, "outbox_events") == {"sent": 4} and statuses(conn, "outbox_memory") == {"sent": 3}
    meta = op_metadata(result, "relay_group")
    assert meta["tables"]["outbox_events"]["sent"] == 4 and meta["tables"]["outbox_memory"]["sent"] == 3
    assert meta["outcome"] == "delivered"
    observed = {
        e.asset_key.to_user_string(): e.event_specific_data.asset_observation.metadata
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    }
    assert observed["outbox/outbox_events"]["sent"].value == 4 and observed["outbox/outbox_memory"]["sent"].value == 3
    assert "outbox/outbox_orders" not in observed  # a table that did nothing is not observed
    run = instance.get_run_by_id(result.run_id)
    assert run.tags["outbox/group"] == "default" and run.tags["outbox/kind"] == "relay"
    assert run.tags[".dagster/outbox.outbox_events"] == "hosted" and run.tags["outbox/outcome"] == "delivered"


def test_a_broken_section_leaves_its_table_out_and_the_rest_relays(db_url, conn, instance, tmp_path):
    """Issue 23 (and 25): one table's mistake in outbox.toml is that table's, not the code location's."""
    config = tmp_path / "outbox.toml"
    config.write_text(
        DEMO_PARTS
        + '[tables.outbox_members]\nhandlers = "no_such_module:registry"\n\n[tables.outbox_memory]\nmode = "compting"\n'
    )
    resources = outbox_resources(url=db_url, config_path=str(config))
    enqueue_n(conn, "outbox_events", 2, topic="org.changed", payload=lambda i: {"org_id": i})
    enqueue_n(conn, "outbox_memory", 2)
    result = run_job(
        "relay_group_default_job",
        resources,
        instance,
        {"ops": {"relay_group": {"config": {"group": "default", "once": True}}}},
    )
    assert result.success
    assert statuses(conn, "outbox_events") == {"sent": 2}
    assert statuses(conn, "outbox_memory") == {"pending": 2}  # left out: its section is invalid
    meta = op_metadata(result, "relay_group")
    # Its handlers module does not import: left out when the settings load, so no relay tries it.
    assert "cannot import no_such_module" in meta["left_out"]["outbox_members"]
    assert meta["problems"] == "-"  # nothing else went wrong
    checks = run_job("outbox_checks_job", resources, instance)
    relay_checks = {
        e.event_specific_data.asset_key.to_user_string(): e.event_specific_data
        for e in checks.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION" and e.event_specific_data.check_name == "relay"
    }
    memory = relay_checks["outbox/outbox_memory"]
    assert not memory.passed and memory.severity == dg.AssetCheckSeverity.ERROR
    assert "mode must be one of competing, single-active, got 'compting'" in memory.description
    assert not relay_checks["outbox/outbox_members"].passed
    assert relay_checks["outbox/outbox_events"].passed
