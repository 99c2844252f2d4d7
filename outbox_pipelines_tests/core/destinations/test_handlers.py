"""In-process handlers through the relay (seeds 002/004), and dedup of sent payloads (seed 003)."""

import threading
from collections import Counter
from datetime import UTC, datetime

import pytest

from outbox_pipelines import HandlerRegistry, Message, Outbox, PermanentError
from outbox_pipelines.core.destinations import HandlerDestination
from outbox_pipelines.core.models import ERROR_TEXT_LIMIT, ClaimedMessage
from outbox_pipelines.core.relay import Relay
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines_tests.conftest import table_settings
from outbox_pipelines_tests.rows import make_due

EVENTS = "outbox_events"
MEMORY = "outbox_memory"
SMALL_RETRY = RetryPolicy(base_s=60.0, max_s=600.0, max_attempts=3, jitter=0.0)


# -- helpers ------------------------------------------------------------------------------------


def enqueue(conn, table: str, topic: str, payload: dict, event_id: str) -> str:
    Outbox(table).enqueue(conn, Message(topic=topic, payload=payload, event_id=event_id), outside_transaction=True)
    return event_id


def run_relay(db_url: str, registry: HandlerRegistry, table: str = EVENTS, threads: int = 1, **overrides):
    overrides.setdefault("retry", SMALL_RETRY)
    settings = table_settings(table, mode="competing", **overrides)
    destination = HandlerDestination(registry, threads=threads, timeout_s=settings.timeout_s)
    try:
        return Relay(db_url, settings, destination, worker_id="test-relay").run(once=True, max_seconds=30)
    finally:
        destination.close()


def row(conn, event_id: str, table: str = EVENTS) -> dict | None:
    return conn.execute(
        f"""SELECT status, attempts, last_error, last_error_code, result_ref,
                   extract(epoch FROM available_at - now())::float8 AS due_in_s
            FROM {table} WHERE event_id = %s""",
        (event_id,),
    ).fetchone()


def state(conn, event_id: str, table: str = EVENTS) -> tuple:
    found = row(conn, event_id, table)
    return (found["status"], found["attempts"], found["last_error_code"]) if found else None


def audit(conn, event_id: str, table: str = EVENTS) -> list[tuple[str, str, str | None]]:
    found = conn.execute(
        """SELECT code, to_status, error_code FROM outbox_audit
           WHERE outbox_table = %s AND event_id = %s ORDER BY id""",
        (table, event_id),
    ).fetchall()
    return [(r["code"], r["to_status"], r["error_code"]) for r in found]


class Calls:
    """Records which handler saw which event."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def handler(self, name: str, result: object = None, error: BaseException | None = None):
        def handle(message: ClaimedMessage):
            with self._lock:
                self.seen.append((name, message.event_id))
            if error is not None:
                raise error
            return result

        handle.__qualname__ = name
        return handle

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.seen if n == name)


# claim = "auto" (the default): a batch delivered within `hold` is written once, at its settle; its one audit
# row per attempt says when it was claimed and by whom (claimed_at, worker).


# -- handlers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 4])
def test_every_handler_of_the_topic_runs(conn, db_url, threads):
    calls, registry = Calls(), HandlerRegistry()
    registry.register("member.created", calls.handler("send_welcome_email", result="mail-1"))
    registry.register("member.created", calls.handler("update_crm", result="crm-1"))
    registry.register("member.created", calls.handler("count_signup"))  # returns nothing
    registry.register("member.deleted", calls.handler("farewell"))
    keys = [enqueue(conn, EVENTS, "member.created", {"member_id": n}, f"m-{n}") for n in range(3)]

    report = run_relay(db_url, registry, threads=threads)

    assert report.sent == 3
    handlers = ("send_welcome_email", "update_crm", "count_signup")
    assert sorted(calls.seen) == sorted((h, k) for k in keys for h in handlers)
    for key in keys:
        assert state(conn, key) == ("sent", 1, None)
        assert row(conn, key)["result_ref"] == "mail-1,crm-1"
        assert audit(conn, key) == [("outbox_flush_success", "sent", None)]


def test_handlers_receive_the_message(conn, db_url):
    received: list[ClaimedMessage] = []
    registry = HandlerRegistry()
    registry.on("org.changed")(received.append)
    Outbox(EVENTS).enqueue(
        conn,
        Message(
            topic="org.changed", payload={"org_id": 7}, event_id="org-7", tenant_id="acme", headers={"trace_id": "t1"}
        ),
        outside_transaction=True,
    )
    run_relay(db_url, registry)
    [message] = received
    assert (message.event_id, message.topic, message.payload, message.tenant_id) == (
        "org-7",
        "org.changed",
        {"org_id": 7},
        "acme",
    )
    assert (message.attempts, message.trace_id) == (1, "t1")


@pytest.mark.parametrize("claim", ["lease", "transaction"])
def test_a_handler_gets_numbers_exactly_as_they_were_enqueued(conn, db_url, claim):
    """The relay decodes jsonb with orjson, which would round integers beyond 64 bits: those come through json."""
    payload = {
        "big": 123456789012345678901234567890,
        "negative": -9223372036854775809,
        "money": 19.99,
        "small": 42,
        "text": "überweisung",
        "nested": [{"id": 18446744073709551616}],
    }
    received: list[ClaimedMessage] = []
    registry = HandlerRegistry()
    registry.on("ledger.posted")(received.append)
    Outbox(EVENTS).enqueue(
        conn,
        Message(topic="ledger.posted", payload=payload, event_id="l-1", headers={"trace_id": "t9", "seq": 10**20}),
        outside_transaction=True,
    )
    run_relay(db_url, registry, claim=claim)
    [message] = received
    assert message.payload == payload
    assert isinstance(message.payload["big"], int) and message.headers["seq"] == 10**20


def test_a_failing_handler_retries_the_message_and_names_every_failing_handler(conn, db_url):
    calls, registry = Calls(), HandlerRegistry()
    registry.register("member.created", calls.handler("record_ok"))
    registry.register("member.created", calls.handler("send_welcome_email", error=RuntimeError("smtp down")))
    registry.register("member.created", calls.handler("update_crm", error=ValueError("crm said 502")))
    failing = enqueue(conn, EVENTS, "member.created", {"member_id": 1}, "m-1")
    other = enqueue(conn, "outbox_events", "member.deleted", {"member_id": 2}, "m-2")
    registry.register("member.deleted", calls.handler("farewell"))

    report = run_relay(db_url, registry)

    assert (report.retried, report.sent) == (1, 1)
    assert state(conn, failing) == ("pending", 1, "HANDLER_ERROR")
    assert state(conn, other) == ("sent", 1, None)
    error = row(conn, failing)["last_error"]
    assert "2 of 3 handlers failed" in error
    assert "send_welcome_email: RuntimeError: smtp down" in error
    assert "update_crm: ValueError: crm said 502" in error
    assert "record_ok" not in error
    assert row(conn, failing)["due_in_s"] == pytest.approx(60, abs=5)  # the table's backoff, database time
    assert audit(conn, failing) == [("outbox_flush_retry", "pending", "HANDLER_ERROR")]


def test_a_handler_that_recovers_sends_the_message_on_a_later_attempt(conn, db_url):
    registry = HandlerRegistry()

    @registry.on("demo.flaky")
    def flaky(message: ClaimedMessage) -> str:
        if message.attempts < 2:
            raise ConnectionError("mail server unreachable")
        return "delivered"

    key = enqueue(conn, EVENTS, "demo.flaky", {"n": 1}, "f-1")
    run_relay(db_url, registry)
    assert state(conn, key) == ("pending", 1, "HANDLER_ERROR")
    make_due(conn, EVENTS)
    run_relay(db_url, registry)
    assert state(conn, key) == ("sent", 2, None)
    assert (row(conn, key)["last_error"], row(conn, key)["result_ref"]) == (None, "delivered")


def test_permanent_error_is_dead_at_once_with_its_code(conn, db_url):
    calls, registry = Calls(), HandlerRegistry()
    unparseable = PermanentError("org.changed needs org_id", code="BAD_PAYLOAD")
    registry.register("org.changed", calls.handler("parse_org", error=unparseable))
    registry.register("org.changed", calls.handler("audit_org", error=RuntimeError("also broken")))
    key = enqueue(conn, EVENTS, "org.changed", {"name": "no id"}, "o-1")

    report = run_relay(db_url, registry)

    assert report.dead_by_code == {"BAD_PAYLOAD": 1}
    assert state(conn, key) == ("dead", 1, "BAD_PAYLOAD")
    assert "org.changed needs org_id" in row(conn, key)["last_error"]
    assert audit(conn, key) == [("outbox_flush_dead", "dead", "BAD_PAYLOAD")]
    make_due(conn, EVENTS)
    run_relay(db_url, registry)
    assert calls.count("parse_org") == 1  # dead is final


def test_a_topic_without_handlers_retries_then_dies_never_dropped(conn, db_url):
    registry = HandlerRegistry()
    registry.register("member.created", lambda message: None)
    key = enqueue(conn, EVENTS, "member.renamed", {"member_id": 1}, "r-1")

    for attempt in (1, 2):
        run_relay(db_url, registry)
        assert state(conn, key) == ("pending", attempt, "NO_SUBSCRIBERS")
        assert "member.renamed" in row(conn, key)["last_error"]
        make_due(conn, EVENTS)
    report = run_relay(db_url, registry)

    assert report.dead_by_code == {"NO_SUBSCRIBERS": 1}
    assert state(conn, key) == ("dead", 3, "NO_SUBSCRIBERS")
    error = row(conn, key)["last_error"]
    assert "gave up after 3 of 3 attempts" in error and "member.renamed" in error
    assert [code for code, _, _ in audit(conn, key)] == [
        "outbox_flush_retry",
        "outbox_flush_retry",
        "outbox_flush_dead",
    ]


def test_a_disabled_topic_is_not_claimed_while_others_flow(conn, db_url):
    calls, registry = Calls(), HandlerRegistry()
    registry.register("member.created", calls.handler("send_welcome_email"))
    registry.register("org.changed", calls.handler("log_org"))
    paused = [enqueue(conn, EVENTS, "member.created", {"member_id": n}, f"m-{n}") for n in range(2)]
    flowing = [enqueue(conn, EVENTS, "org.changed", {"org_id": n}, f"o-{n}") for n in range(2)]
    registry.set_enabled("member.created", False)
    assert not registry.is_enabled("member.created")

    report = run_relay(db_url, registry)

    assert report.sent == 2
    assert [state(conn, k) for k in flowing] == [("sent", 1, None)] * 2
    assert [state(conn, k) for k in paused] == [("pending", 0, None)] * 2
    assert all(audit(conn, k) == [] for k in paused)
    assert calls.count("send_welcome_email") == 0

    registry.set_enabled("member.created", True)
    run_relay(db_url, registry)
    assert [state(conn, k) for k in paused] == [("sent", 1, None)] * 2


def test_delete_on_success_removes_the_row_and_keeps_the_audit(conn, db_url):
    registry = HandlerRegistry()
    registry.register("member.created", lambda message: "mail-queued")
    registry.register("member.broken", lambda message: 1 / 0)
    done = enqueue(conn, EVENTS, "member.created", {"member_id": 1}, "d-1")
    failing = enqueue(conn, EVENTS, "member.broken", {"member_id": 2}, "d-2")

    report = run_relay(db_url, registry, on_success="delete")

    assert (report.sent, report.retried) == (1, 1)
    assert row(conn, done) is None
    assert audit(conn, done) == [("outbox_flush_success", "deleted", None)]
    # A failure keeps the row, as with any policy.
    assert state(conn, failing) == ("pending", 1, "HANDLER_ERROR")
    assert "ZeroDivisionError" in row(conn, failing)["last_error"]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("x" * 5000), ("pending", 1, "HANDLER_ERROR")),
        (PermanentError("y" * 5000, code="BAD_PAYLOAD"), ("dead", 1, "BAD_PAYLOAD")),
    ],
    ids=["retry", "dead"],
)
def test_last_error_is_capped_at_2000_characters(conn, db_url, error, expected):
    registry = HandlerRegistry()
    registry.register("big.error", Calls().handler("verbose", error=error))
    key = enqueue(conn, EVENTS, "big.error", {"n": 1}, "b-1")
    run_relay(db_url, registry)
    assert state(conn, key) == expected
    stored = row(conn, key)["last_error"]
    assert 1000 < len(stored) <= ERROR_TEXT_LIMIT
    assert "verbose: " in stored


def test_last_error_is_capped_when_giving_up(conn, db_url):
    registry = HandlerRegistry()
    registry.register("big.error", Calls().handler("verbose", error=RuntimeError("z" * 5000)))
    key = enqueue(conn, EVENTS, "big.error", {"n": 1}, "b-1")
    run_relay(db_url, registry, retry=RetryPolicy(base_s=60.0, max_s=600.0, max_attempts=1, jitter=0.0))
    assert state(conn, key) == ("dead", 1, "HANDLER_ERROR")
    stored = row(conn, key)["last_error"]
    assert stored.startswith("gave up after 1 of 1 attempts")
    assert len(stored) <= ERROR_TEXT_LIMIT


def test_an_error_text_with_a_nul_character_is_still_recorded(conn, db_url):
    registry = HandlerRegistry()
    registry.register("nul.error", Calls().handler("binary", error=ValueError("bad byte \x00 in input")))
    registry.register("ok", lambda message: None)
    key = enqueue(conn, EVENTS, "nul.error", {"n": 1}, "n-1")
    ok = enqueue(conn, EVENTS, "ok", {"n": 2}, "n-2")
    report = run_relay(db_url, registry)
    assert (report.retried, report.sent) == (1, 1)
    assert state(conn, key) == ("pending", 1, "HANDLER_ERROR")
    assert "bad byte" in row(conn, key)["last_error"]
    assert state(conn, ok) == ("sent", 1, None)


# -- dedup of (topic, payload_sha) on outbox_memory (seed 003) ----------------------------------


def memory_registry(calls: Counter) -> HandlerRegistry:
    registry = HandlerRegistry()

    @registry.on("memory.write")
    def write(message: ClaimedMessage) -> str:
        calls[message.event_id] += 1
        return f"mem-{message.event_id}"

    return registry


def test_dedup_acks_an_already_sent_payload_without_delivering_it(conn, db_url):
    calls: Counter = Counter()
    registry = memory_registry(calls)
    first = enqueue(conn, MEMORY, "memory.write", {"space": "s1", "text": "hello", "tags": ["a", "b"]}, "w-1")
    assert run_relay(db_url, registry, table=MEMORY).sent == 1
    assert row(conn, first, MEMORY)["result_ref"] == "mem-w-1"

    # Same topic and payload (key order does not matter: the digest is of canonical JSON).
    again = enqueue(conn, MEMORY, "memory.write", {"tags": ["a", "b"], "text": "hello", "space": "s1"}, "w-2")
    other_topic = enqueue(conn, MEMORY, "memory.archive", {"space": "s1", "text": "hello", "tags": ["a", "b"]}, "w-3")
    registry.register("memory.archive", lambda message: "archived")
    report = run_relay(db_url, registry, table=MEMORY)

    assert (report.sent, report.dedup_hits) == (2, 1)
    assert calls == Counter({"w-1": 1})  # the duplicate never reached the handler
    assert state(conn, again, MEMORY) == ("sent", 1, "DEDUP_HIT")
    assert row(conn, again, MEMORY)["result_ref"] == "mem-w-1"
    assert audit(conn, again, MEMORY) == [("outbox_flush_dedup_hit", "sent", "DEDUP_HIT")]
    assert state(conn, other_topic, MEMORY) == ("sent", 1, None)  # another topic is another target


def test_dedup_delivers_identical_messages_of_one_batch_once(conn, db_url):
    calls: Counter = Counter()
    payload = {"space": "s1", "text": "same"}
    keys = [enqueue(conn, MEMORY, "memory.write", payload, f"w-{n}") for n in range(3)]
    distinct = enqueue(conn, MEMORY, "memory.write", {"space": "s1", "text": "different"}, "w-x")

    report = run_relay(db_url, memory_registry(calls), table=MEMORY)

    assert (report.claimed, report.batches) == (4, 1)
    assert calls == Counter({"w-0": 1, "w-x": 1})
    assert state(conn, keys[0], MEMORY) == ("sent", 1, None)
    for key in keys[1:]:
        assert state(conn, key, MEMORY) == ("sent", 1, "DEDUP_HIT")
        assert row(conn, key, MEMORY)["result_ref"] == "mem-w-0"
        assert audit(conn, key, MEMORY)[-1] == ("outbox_flush_dedup_hit", "sent", "DEDUP_HIT")
    assert row(conn, distinct, MEMORY)["result_ref"] == "mem-w-x"


def test_dedup_never_acks_a_copy_of_a_failed_delivery(conn, db_url):
    attempts: Counter = Counter()
    registry = HandlerRegistry()

    @registry.on("memory.write")
    def write(message: ClaimedMessage) -> str:
        attempts[message.event_id] += 1
        if message.attempts == 1:
            raise TimeoutError("memory store slow")
        return f"mem-{message.event_id}"

    keys = [enqueue(conn, MEMORY, "memory.write", {"text": "same"}, f"w-{n}") for n in range(2)]
    run_relay(db_url, registry, table=MEMORY)
    assert [state(conn, k, MEMORY) for k in keys] == [("pending", 1, "HANDLER_ERROR")] * 2
    assert attempts == Counter({"w-0": 1})

    make_due(conn, MEMORY)
    run_relay(db_url, registry, table=MEMORY)
    assert [state(conn, k, MEMORY) for k in keys] == [("sent", 2, None), ("sent", 2, "DEDUP_HIT")]
    assert [row(conn, k, MEMORY)["result_ref"] for k in keys] == ["mem-w-0", "mem-w-0"]
    assert attempts == Counter({"w-0": 2})


def test_without_dedup_identical_payloads_are_each_delivered(conn, db_url):
    calls: Counter = Counter()
    keys = [enqueue(conn, MEMORY, "memory.write", {"text": "same"}, f"w-{n}") for n in range(2)]
    run_relay(db_url, memory_registry(calls), table=MEMORY, dedup=False)
    assert calls == Counter({"w-0": 1, "w-1": 1})
    assert [state(conn, k, MEMORY) for k in keys] == [("sent", 1, None)] * 2


def test_a_batch_of_one_runs_on_the_relays_thread():
    seen: list[str] = []
    registry = HandlerRegistry()
    registry.register("t", lambda message: seen.append(threading.current_thread().name))
    destination = HandlerDestination(registry, threads=4)

    def message(n: int) -> ClaimedMessage:
        return ClaimedMessage(
            id=n,
            event_id=f"e{n}",
            tenant_id=None,
            topic="t",
            payload={},
            payload_sha="",
            headers={},
            attempts=1,
            created_at=datetime.now(UTC),
        )

    try:
        assert [o.kind for o in destination.deliver([message(1)])] == ["sent"]
        assert seen == [threading.current_thread().name]  # no hand-off: a quiet table's latency
    finally:
        destination.close()


def test_a_batch_runs_on_exactly_parallelism_threads_at_once_the_relays_own_among_them():
    # Handlers that wait (mail, HTTP) must overlap `threads` at a time, and never more: a barrier of
    # 4 parties is passed only by 4 handlers running together (a missing lane breaks it, failing the
    # message), and the peak count says no fifth ran beside them.
    threads, lock = 4, threading.Lock()
    barrier = threading.Barrier(threads, timeout=10)
    running, peak, names = 0, 0, set()

    def handler(message: ClaimedMessage) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            names.add(threading.current_thread().name)
        try:
            barrier.wait()
        finally:
            with lock:
                running -= 1

    registry = HandlerRegistry()
    registry.register("t", handler)
    destination = HandlerDestination(registry, threads=threads)
    batch = [
        ClaimedMessage(
            id=n,
            event_id=f"e{n}",
            tenant_id=None,
            topic="t",
            payload={},
            payload_sha="",
            headers={},
            attempts=1,
            created_at=datetime.now(UTC),
        )
        for n in range(12)
    ]
    try:
        outcomes = destination.deliver(batch)
    finally:
        destination.close()
    assert [o.kind for o in outcomes] == ["sent"] * 12
    assert peak == threads
    assert threading.current_thread().name in names and len(names) == threads
