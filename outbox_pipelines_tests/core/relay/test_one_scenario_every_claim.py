"""One scenario under every claim mode (lease, transaction, auto): a batch with a delivery, a retry, a death, a
409 "already processed" and a message held behind its dead key head, then a relay killed mid-batch and buried. The
modes share one claim and settle source (sql/queries/outbox.sql's parts): the rows and audit codes they leave agree.
"""

from datetime import timedelta

from outbox_pipelines import Message, Outcome, RetryPolicy
from outbox_pipelines.core import models as m
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.relay import Relay, liveness
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, db_now
from outbox_pipelines_tests.processes import handlers_project_env, start_relay

MODES = ("lease", "transaction", "auto")
CRASHING_HANDLERS = """
import os
from outbox_pipelines.core.destinations.handlers import HandlerRegistry

registry = HandlerRegistry()


def _deliver(message):
    os._exit(3)  # the handler takes its process down mid-batch


registry.register("crash", _deliver)
"""
OUTCOMES = {
    "ok": Outcome.sent(ref="r-1"),
    "flaky": Outcome.retry(m.BROKER_5XX, "HTTP 503"),
    "poison": Outcome.dead(m.BAD_REQUEST, "HTTP 400"),
    "done-before": Outcome.sent(code=m.CONFLICT_PROCESSED),
    "follower": Outcome.sent(),  # never asked: its key's head died and parks the key
}


def _scenario(db_url, conn, env, mode):
    conn.execute(f"TRUNCATE {EVENTS}, outbox_audit")
    messages = [
        Message(topic="t", payload={"n": 1}, event_id="ok"),
        Message(topic="t", payload={"n": 2}, event_id="flaky"),
        Message(topic="t", payload={"n": 3}, event_id="poison", ordering_key="k1"),
        Message(topic="t", payload={"n": 4}, event_id="follower", ordering_key="k1"),
        Message(topic="t", payload={"n": 5}, event_id="done-before"),
    ]
    Outbox(EVENTS).enqueue_many(conn, messages, outside_transaction=True)
    settings = events_settings(claim=mode, retry=RetryPolicy(base_s=60, max_s=60, max_attempts=3, jitter=0))
    destination = ScriptedDestination(lambda msg: OUTCOMES[msg.event_id])
    report = Relay(db_url, settings, destination, worker_id=f"relay-{mode}").run(once=True)
    assert (report.sent, report.retried, report.dead) == (2, 1, 1)
    # The crash: a CLI relay whose handler kills its process while it holds "crash"; the sweep buries it.
    Outbox(EVENTS).enqueue(conn, Message(topic="crash", payload={}, event_id="crash"), outside_transaction=True)
    proc = start_relay(env, EVENTS, "--once")
    assert proc.wait(timeout=60) == 3
    [dead] = liveness.find_dead(conn, now=db_now(conn) + timedelta(seconds=600))
    assert liveness.bury(conn, dead, max_attempts=3) is not None
    found = conn.execute(
        f"SELECT event_id, status, attempts, ordering_blocked, last_error_code,"
        f"       round(extract(epoch FROM greatest(available_at - updated_at, interval '0')))::int AS backoff_s"
        f"  FROM {EVENTS} ORDER BY id"
    ).fetchall()
    codes = conn.execute(
        "SELECT a.event_id, array_agg(a.code ORDER BY a.id) AS codes FROM outbox_audit AS a "
        "WHERE a.outbox_table = %s AND a.code <> 'outbox_claim' GROUP BY a.event_id ORDER BY a.event_id",
        (EVENTS,),
    ).fetchall()
    return found, {r["event_id"]: r["codes"] for r in codes}


def test_every_claim_mode_leaves_the_same_rows_and_audit_codes(db_url, conn, cli_env, tmp_path):
    env = handlers_project_env(cli_env, tmp_path, "crashing_handlers", CRASHING_HANDLERS, "parallelism = 1\n")
    config = tmp_path / "outbox.toml"
    template = config.read_text()
    results = {}
    for mode in MODES:
        config.write_text(template + f'claim = "{mode}"\n')
        results[mode] = _scenario(db_url, conn, env, mode)
    found, codes = results["auto"]
    assert [(r["event_id"], r["status"], r["attempts"], r["ordering_blocked"], r["backoff_s"]) for r in found] == [
        ("ok", "sent", 1, False, 0),
        ("flaky", "pending", 1, False, 60),
        ("poison", "dead", 1, False, 0),
        ("follower", "pending", 0, True, 0),  # parked behind its dead head
        ("done-before", "sent", 1, False, 0),
        ("crash", "pending", 1, False, 0),  # its dead relay's attempt counted by the sweep
    ]
    assert codes == {
        "ok": ["outbox_flush_success"],
        "flaky": ["outbox_flush_retry"],
        "poison": ["outbox_flush_dead"],
        "done-before": ["outbox_flush_success"],
        "crash": ["outbox_requeue"],
    }
    assert results["lease"] == results["auto"]
    # claim = "transaction" keeps no note of what its relay holds (docs/explanation/relay.md, claim modes): the
    # crash rolls its claim back, attempt uncounted, and the sweep has nothing to count. All else agrees.
    found, codes = results["transaction"]
    assert [dict(r) for r in found if r["event_id"] != "crash"] == [
        dict(r) for r in results["auto"][0] if r["event_id"] != "crash"
    ]
    assert [(r["status"], r["attempts"]) for r in found if r["event_id"] == "crash"] == [("pending", 0)]
    assert codes == {k: v for k, v in results["auto"][1].items() if k != "crash"}
