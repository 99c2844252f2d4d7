"""Drill: messages to each destination kind's example consumer (examples/consumers/), relays and consumers killed.

For each kind (HTTP webhooks, Kafka on librdkafka's mock cluster, a RabbitMQ node, NATS JetStream), all real
processes: ``outbox-pipelines relay`` killed with SIGKILL every 2.5 s once it has settled anything since its start
(or once it has sent a tenth of the messages; at the latest after 15 s) and started again (a batch sent but not
settled is sent again), and the consumer killed with SIGKILL every 10 s (or once it has handled a fifth) after its
own first commit, 6 times at most: what it had read but not acknowledged comes again (Kafka from the last committed
offset once the group's 6 s session ends, RabbitMQ's unacked messages, JetStream's after its 0.5 s ack wait, also
once the NATS consumer is stalled 1 s with SIGSTOP at each relay kill and once it is killed between a commit and its
ack; the relay sends a webhook again when no 200 came). The consumer's effect is a row in its own ``shipments``
table, which has no unique key: only the inbox keeps it to one row a message.

Asserted, as a user would check: every message sent, the consumer saw duplicates, and ``shipments`` holds one row
for each message, none twice. The counts (deliveries, duplicates seen, effects, kills) are printed. ``-m drill``
runs 2,000 messages a kind; ``-m soak`` the 10,000 of the long version.
"""

import json
import os
import time

import pytest

from outbox_pipelines_tests.drills.inbox_consumers import KINDS, TABLE, destination, effects, prepare, sent, unsent
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.processes import wait_until

KILL_EVERY_S = 2.5
CONSUMER_KILLS = 6  # at most: a Kafka consumer that replaces a killed one waits out the group's 6 s session
RESULTS_ENV = "OUTBOX_DRILL_RESULTS"


def _drill(kind: str, messages: int, db_url, cli_env, conn, tmp_path) -> dict:  # type: ignore[no-untyped-def]
    progress = bool(os.environ.get("OUTBOX_DRILL_PROGRESS"))
    with destination(kind, tmp_path) as dest:
        fleet = prepare(dest, db_url, cli_env, tmp_path, messages)
        started = time.monotonic()
        try:
            fleet.start_consumer()
            fleet.start_relay()
            deadline = started + (240 if messages <= 2_000 else 600)
            relay_mark, consumer_mark = (started, 0), (started, 0)  # when each started, and the progress then
            while True:
                now, done_sent, done_effects = time.monotonic(), sent(conn), effects(conn)[1]
                if done_sent == messages and done_effects == messages:
                    break
                assert now < deadline, (
                    f"not done in time: {statuses(conn, TABLE)}, effects {effects(conn)}, kills {fleet.relay_kills}, "
                    f"unsent {unsent(conn)}\n{fleet.logs()}"
                )
                assert fleet.consumer is not None and fleet.consumer.poll() is None, (
                    f"the consumer died\n{fleet.logs()}"
                )
                # Each is killed after a few seconds, or sooner once it has done a tenth of the work (a quick
                # destination drains 2,000 messages in less time than that).
                # The first kill as soon as it has sent anything: a fast destination drains 2,000 in well under a
                # second, and the polls below run every 10 ms until that first kill.
                # A relay that has settled nothing since it was started again is left to (up to 6 periods): on a
                # loaded machine its start-up can take most of a period, and killed again before its first
                # settle, the same leased batch spends an attempt at each kill until it is dead.
                first_kill = fleet.relay_kills == 0 and done_sent > 0
                lived = now - relay_mark[0]
                progressed = done_sent > relay_mark[1]
                if done_sent < messages and (
                    first_kill
                    or (progressed and lived > KILL_EVERY_S)
                    or lived > 6 * KILL_EVERY_S
                    or done_sent - relay_mark[1] >= messages // 10
                ):
                    if progress:
                        print(f"{now - started:6.1f}s sent {done_sent} effects {done_effects}: relay killed")
                    fleet.kill_relay()
                    if dest.kind == "nats" and done_effects < messages:
                        fleet.pause_consumer(1.0)  # past its 0.5 s ack wait: JetStream delivers again
                    relay_mark = (time.monotonic(), done_sent)
                # NATS: JetStream drops the relay's resends as duplicates, so the consumer is killed once where it
                # counts, between a commit and its ack: the message comes again after the ack wait.
                if fleet.kill_if_stalled_before_ack():
                    consumer_mark = (time.monotonic(), effects(conn)[1])
                # The consumer, once it has handled some since its start (a Kafka consumer first waits for its
                # group to hand it the partitions of the one killed before).
                if (
                    fleet.consumer_kills < CONSUMER_KILLS
                    and consumer_mark[1] < done_effects < messages
                    and (now - consumer_mark[0] > 4 * KILL_EVERY_S or done_effects - consumer_mark[1] >= messages // 5)
                ):
                    fleet.kill_consumer()
                    consumer_mark = (time.monotonic(), effects(conn)[1])  # after the kill: its last commits in
                time.sleep(0.01 if fleet.relay_kills == 0 else 0.1)
            done = time.monotonic()
            # The redeliveries still owed (unacknowledged when a consumer died) come and are skipped.
            time.sleep(3.0)
            wait_until(lambda: fleet.consumer and fleet.consumer.poll() is None, 5, "the consumer still running")
        finally:
            fleet.stop()
        lines = fleet.lines()
        rows, distinct = effects(conn)
        ids = {r["event_id"] for r in conn.execute("SELECT event_id FROM shipments")}
        inbox = conn.execute("SELECT count(*) AS n FROM shipping_inbox").fetchone()["n"]
        figures = {
            "drill": f"inbox_{kind}",
            "messages": messages,
            "table": statuses(conn, TABLE),
            "deliveries": len(lines),
            "duplicates_seen": sum(1 for verdict, _ in lines if verdict == "duplicate"),
            "effects": rows,
            "distinct_effects": distinct,
            "inbox_entries": inbox,
            "relay_kills": fleet.relay_kills,
            "consumer_kills": fleet.consumer_kills,
            "consumer_pauses": fleet.consumer_pauses,
            "seconds": round(done - started, 1),
        }
    print(f"\ninbox drill ({kind}): {json.dumps(figures)}")
    if os.environ.get(RESULTS_ENV):
        with open(os.environ[RESULTS_ENV], "a") as out:
            out.write(json.dumps(figures) + "\n")
    assert figures["table"] == {"sent": messages}
    assert ids == {f"inbox-{i}" for i in range(messages)}
    assert rows == messages and inbox == messages, figures
    assert figures["duplicates_seen"] > 0, figures
    assert figures["relay_kills"] > 0 and figures["consumer_kills"] > 0, figures
    return figures


@pytest.mark.drill
@pytest.mark.parametrize("kind", KINDS)
def test_each_message_has_one_effect_through_kills_and_redeliveries(kind, db_url, cli_env, conn, tmp_path):
    _drill(kind, 2_000, db_url, cli_env, conn, tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", KINDS)
def test_10000_messages_have_one_effect_each_through_kills_and_redeliveries(kind, db_url, cli_env, conn, tmp_path):
    _drill(kind, 10_000, db_url, cli_env, conn, tmp_path)
