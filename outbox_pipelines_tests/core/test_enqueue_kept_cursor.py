"""``enqueue(conn, …)`` and ``enqueue_async(conn, …)`` on a psycopg connection run on one cursor the connection
keeps (a new cursor per call cost a tenth of what the enqueue adds, issue 47): each call still answers with its
own row's id when threads or coroutines share the connection, after a failed call, and beside the
application's own cursors."""

import asyncio
import threading

import psycopg
import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.errors import UnknownTable

OUTBOX = Outbox("outbox_events")


def _ids_by_event(conn) -> dict[str, int]:
    return {row["event_id"]: row["id"] for row in conn.execute("SELECT id, event_id FROM outbox_events")}


def test_threads_sharing_one_connection_each_get_their_own_rows_id(db_url, conn):
    results: dict[str, int] = {}
    errors: list[BaseException] = []
    with psycopg.connect(db_url) as shared:

        def enqueue_many_times(thread: int) -> None:
            try:
                for n in range(40):
                    result = OUTBOX.enqueue(shared, Message(topic="t", payload={"n": n}, event_id=f"t{thread}-{n}"))
                    results[result.event_id] = result.id
            except BaseException as exc:  # noqa: B036 (reported by the assertion below)
                errors.append(exc)

        threads = [threading.Thread(target=enqueue_many_times, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        shared.commit()
    assert errors == []
    assert len(results) == 160
    assert results == _ids_by_event(conn)


def test_coroutines_sharing_one_async_connection_each_get_their_own_rows_id(db_url, conn):
    async def scenario() -> dict[str, int]:
        async with await psycopg.AsyncConnection.connect(db_url) as shared:

            async def one(n: int) -> tuple[str, int]:
                result = await OUTBOX.enqueue_async(shared, Message(topic="t", payload={"n": n}, event_id=f"c{n}"))
                return result.event_id, result.id

            answers = await asyncio.gather(*(one(n) for n in range(50)))
            await shared.commit()
        return dict(answers)

    results = asyncio.run(scenario())
    assert len(results) == 50
    assert results == _ids_by_event(conn)


def test_after_a_failed_enqueue_the_next_transaction_enqueues_and_reads_its_id(db_url, conn):
    with psycopg.connect(db_url) as app:
        first = OUTBOX.enqueue(app, Message(topic="t", payload={"n": 1}, event_id="before"))
        app.commit()
        with pytest.raises(UnknownTable):  # the statement fails on the kept cursor, aborting the transaction
            Outbox("no_such_outbox").enqueue(app, Message(topic="t", payload={"n": 2}, event_id="lost"))
        app.rollback()
        second = OUTBOX.enqueue(app, Message(topic="t", payload={"n": 3}, event_id="after"))
        duplicate = OUTBOX.enqueue(app, Message(topic="t", payload={"n": 1}, event_id="before"))
        app.commit()
    stored = _ids_by_event(conn)
    assert (first.id, second.id) == (stored["before"], stored["after"])
    assert duplicate.duplicate and duplicate.id == first.id and duplicate.same_payload
    assert "lost" not in stored


def test_the_applications_own_cursor_keeps_its_result_across_an_enqueue(db_url, conn):
    with psycopg.connect(db_url) as app, app.cursor() as mine:
        mine.execute("SELECT n FROM generate_series(1, 3) AS n")
        result = OUTBOX.enqueue(app, Message(topic="t", payload={}, event_id="beside"))
        assert mine.fetchall() == [(1,), (2,), (3,)]
        app.commit()
    assert _ids_by_event(conn) == {"beside": result.id}
