"""Seed 004 §7 / §10.3: tenants in the audit, an index for per-tenant questions, clean-up per tenant."""

from datetime import timedelta

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.models import Outcome
from outbox_pipelines.core.operations.maintenance import clean
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.conftest import run_cli, table_settings
from outbox_pipelines_tests.helpers import ScriptedDestination
from outbox_pipelines_tests.rows import make_sent

EVENTS = "outbox_events"


def enqueue_for(conn, tenant: str, n: int) -> None:
    Outbox(EVENTS).enqueue_many(
        conn,
        [Message(topic="t", payload={"n": i}, tenant_id=tenant, event_id=f"{tenant}-{i}") for i in range(n)],
        outside_transaction=True,
    )


@pytest.mark.parametrize(
    ("claim", "codes"),
    [
        ("auto", {"outbox_flush_success", "outbox_flush_retry"}),
        ("lease", {"outbox_claim", "outbox_flush_success", "outbox_flush_retry"}),
    ],
)
def test_every_audit_row_of_a_message_carries_its_tenant(db_url, conn, claim, codes):
    enqueue_for(conn, "acme", 2)
    answers = iter([Outcome.sent(ref="r1"), Outcome.retry("BROKER_5XX", "HTTP 503")])
    settings = table_settings(EVENTS, mode="competing", claim=claim)
    Relay(db_url, settings, ScriptedDestination(lambda m: next(answers))).run(once=True)
    audit = conn.execute(
        "SELECT code, tenant_id FROM outbox_audit WHERE outbox_table = %s AND message_id IS NOT NULL", (EVENTS,)
    ).fetchall()
    assert {a["code"] for a in audit} >= codes
    assert {a["tenant_id"] for a in audit} == {"acme"}


def test_a_tenant_index_serves_per_tenant_questions(conn):
    index = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname LIKE %s", (EVENTS, "%by_tenant")
    ).fetchone()
    assert "(tenant_id, published_at, id)" in index["indexdef"]


def test_clean_can_be_scoped_to_one_tenant(db_url, conn, cli_env):
    enqueue_for(conn, "acme", 3)
    enqueue_for(conn, "globex", 2)
    make_sent(conn, EVENTS, age=timedelta(days=30))
    settings = table_settings(EVENTS)
    report = clean(db_url, settings, tenant_id="acme")
    assert report.deleted_sent == 3
    left = conn.execute("SELECT tenant_id, count(*) AS n FROM outbox_events GROUP BY 1").fetchall()
    assert [(r["tenant_id"], r["n"]) for r in left] == [("globex", 2)]
    done = run_cli(cli_env, "clean", "--table", EVENTS, "--tenant", "globex")
    assert done.returncode == 0, done.stderr
    assert "deleted 2 sent rows of tenant globex" in done.stdout
    assert conn.execute("SELECT count(*) AS n FROM outbox_events").fetchone()["n"] == 0
