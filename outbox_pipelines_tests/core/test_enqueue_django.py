"""``outbox.enqueue(connection, message)`` on Django's own connection, in a real Django process (settings
configured, Django's PostgreSQL backend): inside ``transaction.atomic()`` the message commits and rolls back
with the business write, on the default alias and another; outside it, it is refused; on the psycopg2
backend, it is refused with the fix."""

import json
import subprocess
import sys
import textwrap

import pytest

from outbox_pipelines.core.storage.database_url import parse_url

SETUP = """
import json, sys
import django
from django.conf import settings

db = json.loads(sys.argv[1])
settings.configure(
    DATABASES={alias: {"ENGINE": "django.db.backends.postgresql", **db} for alias in ("default", "other")},
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()
from django.db import connection, connections, transaction
from outbox_pipelines import Message, Outbox
outbox = Outbox("outbox_events")
"""


def _django_settings(db_url: str) -> str:
    info = parse_url(db_url)
    return json.dumps(
        {
            "NAME": info.get("dbname"),
            "USER": info.get("user", ""),
            "PASSWORD": info.get("password", ""),
            "HOST": info.get("host", ""),
            "PORT": info.get("port", ""),
        }
    )


def _run(db_url: str, body: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(prelude) + SETUP + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, _django_settings(db_url)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def business_table(conn):
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")


def _stored(conn) -> list[str]:
    return [row["event_id"] for row in conn.execute("SELECT event_id FROM outbox_events ORDER BY id")]


def _business(conn) -> list[int]:
    return [row["id"] for row in conn.execute("SELECT id FROM business ORDER BY id")]


def test_inside_atomic_the_message_commits_and_rolls_back_with_the_models(db_url, conn, business_table):
    done = _run(
        db_url,
        """
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO business VALUES (1)")
            first = outbox.enqueue(connection, Message(topic="t", payload={"n": 1}, event_id="kept"))
            again = outbox.enqueue(connection, Message(topic="t", payload={"n": 1}, event_id="kept"))
            outbox.enqueue_many(connection, [Message(topic="t", payload={"n": n}, event_id=f"m-{n}") for n in range(3)])
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("INSERT INTO business VALUES (2)")
                outbox.enqueue(connection, Message(topic="t", payload={"n": 2}, event_id="dropped"))
                raise RuntimeError("the view failed")
        except RuntimeError:
            pass
        with transaction.atomic():  # a savepoint rolled back inside a transaction that commits
            with connection.cursor() as cur:
                cur.execute("INSERT INTO business VALUES (3)")
            try:
                with transaction.atomic():
                    outbox.enqueue(connection, Message(topic="t", payload={"n": 3}, event_id="inner-dropped"))
                    raise RuntimeError
            except RuntimeError:
                pass
        with transaction.atomic(using="other"):
            outbox.enqueue(connections["other"], Message(topic="t", payload={"n": 4}, event_id="other-alias"))
        print(json.dumps([first.duplicate, again.duplicate, again.id == first.id]))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True, True]
    assert _business(conn) == [1, 3]
    assert _stored(conn) == ["kept", "m-0", "m-1", "m-2", "other-alias"]


def test_outside_atomic_it_is_refused_and_nothing_is_written(db_url, conn):
    done = _run(
        db_url,
        """
        from outbox_pipelines.core.errors import NoTransaction
        try:
            outbox.enqueue(connection, Message(topic="t", payload={}, event_id="autocommit"))
        except NoTransaction as exc:
            print(exc)
        outbox.enqueue(connection, Message(topic="t", payload={}, event_id="on-purpose"), outside_transaction=True)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "outside transaction.atomic()" in done.stdout
    assert "with transaction.atomic(using='default'):" in done.stdout
    assert _stored(conn) == ["on-purpose"]


def test_an_async_view_enqueues_through_sync_to_async_and_enqueue_async_says_so(db_url, conn):
    done = _run(
        db_url,
        """
        import asyncio
        from asgiref.sync import sync_to_async

        @sync_to_async
        def create_order():
            with transaction.atomic():
                outbox.enqueue(connection, Message(topic="t", payload={}, event_id="from-async-view"))

        async def view():
            await create_order()
            try:
                await outbox.enqueue_async(connection, Message(topic="t", payload={}))
            except TypeError as exc:
                print(exc)

        asyncio.run(view())
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "Django's connection is synchronous" in done.stdout
    assert "sync_to_async" in done.stdout
    assert _stored(conn) == ["from-async-view"]


def test_on_djangos_psycopg2_backend_it_is_refused_with_the_switch(db_url, conn):
    # Django takes psycopg2 when psycopg 3 cannot be imported: hidden while its backend loads.
    prelude = """
    import sys
    import psycopg
    import outbox_pipelines
    saved, sys.modules["psycopg"] = sys.modules["psycopg"], None
    import django.db.backends.postgresql.base
    sys.modules["psycopg"] = saved
    """
    done = _run(
        db_url,
        """
        assert not django.db.backends.postgresql.base.is_psycopg3
        with transaction.atomic():
            try:
                outbox.enqueue(connection, Message(topic="t", payload={}))
            except TypeError as exc:
                print(exc)
        """,
        prelude,
    )
    assert done.returncode == 0, done.stderr
    assert "is on psycopg2" in done.stdout
    assert "pip install 'psycopg[binary]'" in done.stdout
    assert _stored(conn) == []
