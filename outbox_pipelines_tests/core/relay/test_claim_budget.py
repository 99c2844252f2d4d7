"""A claim's byte budget (issue 42, a table's ``batch_bytes``): a batch stops before the message whose payload and
headers would pass it, one message at least, in the claim statement itself, so that rows larger than anyone meant
(written by SQL, or before the database held a limit) never reach a relay's memory together."""

import json
import subprocess
import sys
from collections.abc import Sequence

import pytest

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.models import ClaimedMessage, Outcome
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.storage import payload_limit
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings

KB = 1000
MIB = 1024 * 1024


def write_big_rows(conn, count: int, blob_chars: int) -> None:
    """``count`` pending rows whose payload is one string of ``blob_chars`` letters, written by SQL."""
    conn.execute(
        f"INSERT INTO {EVENTS} (event_id, topic, payload, payload_sha) "
        "SELECT 'big-' || n, 't', jsonb_build_object('blob', repeat('x', %s)), 's' FROM generate_series(1, %s) AS n",
        (blob_chars, count),
    )


def statuses(conn) -> list[str]:
    return [r["status"] for r in conn.execute(f"SELECT status FROM {EVENTS} ORDER BY id").fetchall()]


class Batches(Destination):
    """Accepts every message, and keeps how many came in each batch."""

    name = "batches"

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def deliver(self, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        self.sizes.append(len(messages))
        return [Outcome.sent() for _ in messages]

    def close(self) -> None:
        pass


@pytest.fixture
def five_rows_of_100_kb(db_url, conn):
    write_big_rows(conn, 5, 100 * KB)  # each body (payload and headers as JSON text) is 100,016 bytes
    return conn


def test_a_lease_claim_stops_before_the_row_that_would_pass_the_budget(db_url, five_rows_of_100_kb):
    conn = five_rows_of_100_kb
    table = OutboxTable(conn, EVENTS)
    first = table.claim("w", 100, 60, max_bytes=250 * KB)
    assert len(first) == 2
    assert statuses(conn) == ["sending", "sending", "pending", "pending", "pending"]
    assert [m.payload["blob"] == "x" * 100 * KB for m in first] == [True, True]
    # One message at least: alone over the budget, it still goes.
    alone = table.claim("w", 100, 60, max_bytes=10 * KB)
    assert len(alone) == 1
    assert [len(table.claim("w", 100, 60, max_bytes=250 * KB)) for _ in range(2)] == [2, 0]
    assert statuses(conn) == ["sending"] * 5


def test_a_transaction_claim_stops_there_too_and_leaves_the_rest_to_the_next_claim(db_url, five_rows_of_100_kb):
    conn = five_rows_of_100_kb
    table = OutboxTable(conn, EVENTS)
    with conn.transaction():
        held = table.claim_held(100, 60, max_bytes=250 * KB)
        assert [m.attempts for m in held] == [1, 1]
    with conn.transaction():
        assert [m.id for m in table.claim_held(100, 60, max_bytes=250 * KB)] == [m.id for m in held]


def test_the_budget_counts_the_headers_too(db_url, conn):
    conn.execute(
        f"INSERT INTO {EVENTS} (event_id, topic, payload, payload_sha, headers) "
        "SELECT 'h-' || n, 't', '{}', 's', jsonb_build_object('h', repeat('y', 100000)) FROM generate_series(1, 3) AS n"
    )
    assert len(OutboxTable(conn, EVENTS).claim("w", 100, 60, max_bytes=250 * KB)) == 2


def test_rows_stored_before_the_database_kept_their_size_are_measured_at_claim(db_url, conn):
    """Rows written before migration 0020 (no json_bytes): the claim reads their JSON's size itself, only for the rows
    that may fit, and the budget holds as for the others."""
    conn.execute(f"ALTER TABLE {EVENTS} DISABLE TRIGGER outbox_payload_limit")  # as before 0020
    write_big_rows(conn, 5, 100 * KB)
    conn.execute(f"ALTER TABLE {EVENTS} ENABLE TRIGGER outbox_payload_limit")
    assert conn.execute(f"SELECT count(*) AS n FROM {EVENTS} WHERE json_bytes IS NULL").fetchone()["n"] == 5
    table = OutboxTable(conn, EVENTS)
    for mode in ("lease", "transaction"):
        with conn.transaction():
            claimed = (
                table.claim("w", 100, 60, max_bytes=250 * KB)
                if mode == "lease"
                else table.claim_held(100, 60, max_bytes=250 * KB)
            )
            assert len(claimed) == 2, mode


def test_a_batch_measures_at_most_16_rows_stored_before_the_database_kept_their_size(db_url, conn):
    """So that a backlog of large old rows is not read 100 at a time to take one; newer rows are not held to it."""
    conn.execute(f"ALTER TABLE {EVENTS} DISABLE TRIGGER outbox_payload_limit")  # as before 0020
    write_big_rows(conn, 20, 10)
    conn.execute(f"ALTER TABLE {EVENTS} ENABLE TRIGGER outbox_payload_limit")
    table = OutboxTable(conn, EVENTS)
    assert [len(table.claim("w", 100, 60)) for _ in range(3)] == [16, 4, 0]
    conn.execute(f"UPDATE {EVENTS} SET event_id = 'old-' || id")
    write_big_rows(conn, 40, 10)  # their size kept: a batch of 40
    with conn.transaction():
        assert len(table.claim_held(100, 60)) == 40


@pytest.mark.parametrize("claim", ["auto", "lease", "transaction"])
def test_a_relay_delivers_every_row_in_batches_within_its_budget(db_url, five_rows_of_100_kb, claim):
    destination = Batches()
    report = Relay(db_url, events_settings(claim=claim, batch_bytes=250 * KB), destination).run(once=True)
    assert (report.sent, destination.sizes) == (5, [2, 2, 1])
    assert statuses(five_rows_of_100_kb) == ["sent"] * 5


# The relay's own process: draining, it reads VmHWM (the most it ever held resident) before and after.
RELAY_SCRIPT = """
import json, sys
from outbox_pipelines.core.destinations.paper import PaperBroker
from outbox_pipelines.core.relay import Relay
from outbox_pipelines_tests.core.relay.events import events_settings

def hwm_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

relay = Relay(sys.argv[1], events_settings(), PaperBroker())
before = hwm_kib()
report = relay.run(once=True)
print(json.dumps({"before_kib": before, "after_kib": hwm_kib(), "sent": report.sent}))
"""


def test_a_relay_given_50_rows_of_10_mib_keeps_its_memory_near_the_budget(db_url, conn):
    """Written by SQL before the database held a limit of their size: 500 MiB in all, which one batch of the default
    100 messages took at once. With the default budget (16 MiB) a batch holds one of them."""
    payload_limit.apply(db_url, [EVENTS], 11 * MIB)  # a limit raised for them (or rows older than the limit)
    write_big_rows(conn, 50, 10 * MIB)
    done = subprocess.run(
        [sys.executable, "-c", RELAY_SCRIPT, db_url], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    grew_mib = (figures["after_kib"] - figures["before_kib"]) / 1024
    assert figures["sent"] == 50
    assert grew_mib < 200, f"the relay's resident memory grew by {grew_mib:.0f} MiB draining 50 rows of 10 MiB"
    assert statuses(conn) == ["sent"] * 50
