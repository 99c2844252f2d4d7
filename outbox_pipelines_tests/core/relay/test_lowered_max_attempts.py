"""Issue 22: lowering ``max_attempts`` below a waiting row's attempts gives it no further delivery.

Before: the claim checked the limit only for expired leases, so a retrying row at or past the new limit
was delivered once more before it died. Now it goes dead at its next claim (``MAX_ATTEMPTS``, audited
like any death), and the destination never sees it again; rows still under the limit are delivered.
Real CLI relays, a real HTTP sink.
"""

from pathlib import Path

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import rows

HOOKS = "outbox_events"  # shipped as a handlers table; the team's outbox.toml turns it into a webhook table


def settings(path: Path, url: str, max_attempts: int, paused: str = "") -> None:
    path.write_text(
        f'[tables.{HOOKS}]\ndestination = "http"\nurl = "{url}"\nmode = "competing"\n'
        f'max_attempts = {max_attempts}\nbase = "1ms"\nmax_backoff = "1ms"\njitter = 0.0\n'
        f"paused_topics = [{paused}]\n"
    )


def test_rows_at_or_past_a_lowered_limit_die_at_their_next_claim_without_a_delivery(cli_env, conn, http_sink, tmp_path):
    config = tmp_path / "outbox.toml"
    env = {**cli_env, "OUTBOX_CONFIG": str(config)}
    failing = {"k-worn": 3, "k-once": 1}  # how many times the receiver answers each key 503
    http_sink.script = lambda key, attempt, body: (503, {}, b"busy") if attempt <= failing.get(key, 0) else None
    outbox = Outbox(HOOKS)

    def relay_one() -> None:  # one claim of one message per run: each run is one attempt
        result = run_cli(env, "relay", "--table", HOOKS, "--once", "--max-entries", "1")
        assert result.returncode == 0, result.stderr

    settings(config, http_sink.url, max_attempts=10)
    outbox.enqueue(conn, Message(topic="worn", payload={"k": 1}, event_id="k-worn"), outside_transaction=True)
    for _ in range(3):
        relay_one()
    outbox.enqueue(conn, Message(topic="t", payload={"k": 2}, event_id="k-once"), outside_transaction=True)
    settings(config, http_sink.url, max_attempts=10, paused='"worn"')  # only k-once is claimed now
    relay_one()
    by_key = {r["event_id"]: r for r in rows(conn, HOOKS)}
    assert {k: (r["status"], r["attempts"]) for k, r in by_key.items()} == {
        "k-worn": ("pending", 3),
        "k-once": ("pending", 1),
    }
    requests_before = dict(http_sink.counts)

    settings(config, http_sink.url, max_attempts=2)  # the team lowers the limit; the receiver is healthy now
    failing.clear()
    result = run_cli(env, "relay", "--table", HOOKS, "--once", "--json")
    assert result.returncode == 0, result.stderr
    by_key = {r["event_id"]: r for r in rows(conn, HOOKS)}
    worn = by_key["k-worn"]
    assert (worn["status"], worn["last_error_code"]) == ("dead", "MAX_ATTEMPTS")
    assert "past max_attempts = 2" in worn["last_error"]
    assert http_sink.counts["k-worn"] == requests_before["k-worn"]  # not delivered again
    assert by_key["k-once"]["status"] == "sent"  # under the new limit: its last attempt is delivered
    assert http_sink.counts["k-once"] == requests_before["k-once"] + 1
    audit = conn.execute(
        "SELECT code, error_code, to_status FROM outbox_audit WHERE event_id = 'k-worn' ORDER BY id DESC LIMIT 1"
    ).fetchone()
    assert audit == {"code": "outbox_flush_dead", "error_code": "MAX_ATTEMPTS", "to_status": "dead"}
