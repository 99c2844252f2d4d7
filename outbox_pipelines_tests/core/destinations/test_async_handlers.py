"""``async def`` handlers: the relay awaits them (their body runs, their outcome counts like a sync handler's),
at most the table's timeout; a handler the relay could not run is refused when it is registered or when the
settings load, never marked sent."""

import asyncio
import textwrap
import time

import pytest

from outbox_pipelines import HandlerRegistry, PermanentError
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.core.destinations.test_handlers import enqueue, run_relay, state


def test_an_async_handler_runs_and_its_message_is_sent_only_after_its_body_ran(db_url, conn):
    ran: list[str] = []
    registry = HandlerRegistry()

    @registry.on("org.changed")
    async def remember(message: ClaimedMessage) -> str:
        await asyncio.sleep(0.01)  # it really is awaited: the line after a suspension runs
        ran.append(message.event_id)
        return f"ref-{message.payload['n']}"

    for n in range(3):
        enqueue(conn, "outbox_events", "org.changed", {"n": n}, f"e-{n}")
    report = run_relay(db_url, registry, threads=2)
    assert sorted(ran) == ["e-0", "e-1", "e-2"]
    assert report.sent == 3
    rows = conn.execute("SELECT event_id, status, result_ref FROM outbox_events ORDER BY id").fetchall()
    assert [(r["event_id"], r["status"], r["result_ref"]) for r in rows] == [
        ("e-0", "sent", "ref-0"),
        ("e-1", "sent", "ref-1"),
        ("e-2", "sent", "ref-2"),
    ]


def test_an_async_handlers_failures_count_as_a_sync_handlers_do(db_url, conn):
    registry = HandlerRegistry()

    @registry.on("flaky")
    async def fails(message: ClaimedMessage) -> None:
        raise RuntimeError("the mail server said no")

    @registry.on("malformed")
    async def refuses(message: ClaimedMessage) -> None:
        raise PermanentError("no email address", code="BAD_PAYLOAD")

    enqueue(conn, "outbox_events", "flaky", {}, "retry-me")
    enqueue(conn, "outbox_events", "malformed", {}, "dead-at-once")
    run_relay(db_url, registry)
    assert state(conn, "retry-me") == ("pending", 1, "HANDLER_ERROR")
    assert (
        "RuntimeError: the mail server said no"
        in conn.execute("SELECT last_error FROM outbox_events WHERE event_id = 'retry-me'").fetchone()["last_error"]
    )
    assert state(conn, "dead-at-once") == ("dead", 1, "BAD_PAYLOAD")


def test_an_async_handler_past_the_tables_timeout_is_cancelled_and_the_message_retries(db_url, conn):
    cancelled: list[str] = []
    registry = HandlerRegistry()

    @registry.on("slow")
    async def hangs(message: ClaimedMessage) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(message.event_id)
            raise

    enqueue(conn, "outbox_events", "slow", {}, "hung")
    started = time.monotonic()
    run_relay(db_url, registry, timeout_s=0.5)
    assert time.monotonic() - started < 20
    assert state(conn, "hung") == ("pending", 1, "HANDLER_TIMEOUT")
    assert (
        "after the table's timeout of 0.5s"
        in conn.execute("SELECT last_error FROM outbox_events WHERE event_id = 'hung'").fetchone()["last_error"]
    )
    assert cancelled == ["hung"]


def test_a_sync_handler_that_returns_a_coroutine_has_it_awaited_not_dropped(db_url, conn):
    ran: list[str] = []

    async def work(message: ClaimedMessage) -> None:
        ran.append(message.event_id)

    registry = HandlerRegistry()
    registry.register("org.changed", lambda message: work(message))
    enqueue(conn, "outbox_events", "org.changed", {}, "via-lambda")
    run_relay(db_url, registry)
    assert ran == ["via-lambda"]
    assert state(conn, "via-lambda") == ("sent", 1, None)


def test_a_handler_the_relay_could_not_run_is_refused_at_register():
    registry = HandlerRegistry()

    def generator(message):
        yield message

    async def async_generator(message):
        yield message

    with pytest.raises(TypeError, match="is a generator function: calling it runs nothing"):
        registry.register("t", generator)
    with pytest.raises(TypeError, match="is an async generator function"):
        registry.register("t", async_generator)
    with pytest.raises(TypeError, match="must be a function"):
        registry.register("t", "module:function")  # type: ignore[arg-type]
    assert registry.topics == ()


def test_a_handlers_module_with_an_async_handler_relays_from_the_cli(cli_env, conn, tmp_path):
    """As a team ships it: an ``async def`` handler in their handlers module, the table declared in outbox.toml,
    relayed by ``outbox-pipelines relay --once``."""
    package = tmp_path / "shop_handlers.py"
    package.write_text(
        textwrap.dedent(
            """
            import asyncio
            from outbox_pipelines import HandlerRegistry

            registry = HandlerRegistry()

            @registry.on("order.paid")
            async def notify(message):
                await asyncio.sleep(0)
                with open(message.payload["marker"], "a") as out:
                    out.write(message.event_id + "\\n")
            """
        )
    )
    (tmp_path / "outbox.toml").write_text(
        textwrap.dedent(
            """
            [tables.shop_outbox]
            destination = "handlers"
            handlers = "shop_handlers:registry"
            timeout = "2s"
            """
        )
    )
    env = {**cli_env, "PYTHONPATH": f"{tmp_path}:{cli_env['PYTHONPATH']}"}
    created = run_cli(env, "db", "create-table", "shop_outbox", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    marker = tmp_path / "ran.txt"
    for n in range(2):
        queued = run_cli(
            env,
            "enqueue",
            "--table",
            "shop_outbox",
            "--topic",
            "order.paid",
            "--payload",
            f'{{"marker": "{marker}"}}',
            "--event-id",
            f"paid-{n}",
            cwd=tmp_path,
        )
        assert queued.returncode == 0, queued.stderr
    relayed = run_cli(env, "relay", "--table", "shop_outbox", "--once", cwd=tmp_path)
    assert relayed.returncode == 0, relayed.stderr
    assert "never awaited" not in relayed.stderr
    assert sorted(marker.read_text().split()) == ["paid-0", "paid-1"]
    statuses = conn.execute("SELECT status FROM shop_outbox ORDER BY id").fetchall()
    assert [row["status"] for row in statuses] == ["sent", "sent"]
