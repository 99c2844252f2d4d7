"""What an application can pass to ``enqueue``: its psycopg connection or cursor, its SQLAlchemy Connection
or Session. Each joins the application's transaction: a rollback leaves neither the business row nor the
message, a commit keeps both."""

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.rows import dict_row, namedtuple_row
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.storage.db import sqlalchemy_url

OUTBOX = Outbox("outbox_events")


def _stored(conn) -> list[str]:
    return [row["event_id"] for row in conn.execute("SELECT event_id FROM outbox_events ORDER BY id")]


def _business(conn) -> list[int]:
    return [row["id"] for row in conn.execute("SELECT id FROM business ORDER BY id")]


@pytest.fixture
def business_table(conn):
    conn.execute("CREATE TABLE business (id int PRIMARY KEY)")


@pytest.mark.parametrize("cursor_class", [psycopg.Cursor, psycopg.ClientCursor, psycopg.RawCursor])
def test_on_the_applications_cursor_the_message_commits_and_rolls_back_with_the_business_row(
    db_url, conn, business_table, cursor_class
):
    with psycopg.connect(db_url) as app:
        insert = (
            "INSERT INTO business VALUES ($1)"
            if cursor_class is psycopg.RawCursor
            else "INSERT INTO business VALUES (%s)"
        )
        with cursor_class(app) as cur:
            cur.execute(insert, (1,))
            kept = OUTBOX.enqueue(cur, Message(topic="t", payload={"n": 1}, event_id="kept"))
        app.commit()
        with cursor_class(app) as cur:
            cur.execute(insert, (2,))
            OUTBOX.enqueue(cur, Message(topic="t", payload={"n": 2}, event_id="dropped"))
        app.rollback()
    assert _business(conn) == [1]
    assert _stored(conn) == ["kept"]
    assert conn.execute("SELECT id FROM outbox_events").fetchone()["id"] == kept.id
    assert kept.duplicate is False


def test_on_a_cursor_a_duplicate_is_reported_and_the_transaction_goes_on(db_url, conn, business_table):
    with psycopg.connect(db_url) as app:
        with app.cursor() as cur:
            first = OUTBOX.enqueue(cur, Message(topic="t", payload={"n": 1}, event_id="same"))
            again = OUTBOX.enqueue(cur, Message(topic="t", payload={"n": 2}, event_id="same"))
            cur.execute("INSERT INTO business VALUES (1)")
        app.commit()
    assert (again.id, again.duplicate, again.same_payload) == (first.id, True, False)
    assert _business(conn) == [1]
    assert _stored(conn) == ["same"]


@pytest.mark.parametrize("row_factory", [dict_row, namedtuple_row])
def test_the_cursor_keeps_making_the_applications_rows(db_url, conn, business_table, row_factory):
    with psycopg.connect(db_url) as app, app.cursor(row_factory=row_factory) as cur:
        result = OUTBOX.enqueue(cur, Message(topic="t", payload={"n": 1}))
        cur.execute("SELECT 1 AS one")
        row = cur.fetchone()
        app.commit()
    assert row == ({"one": 1} if row_factory is dict_row else (1,))
    assert row_factory is dict_row or row.one == 1
    assert isinstance(result.id, int)


def test_on_a_server_side_cursor_the_enqueue_runs_on_its_connection(db_url, conn):
    with psycopg.connect(db_url) as app:
        with app.cursor(name="reader") as named:
            named.execute("SELECT 1")
            OUTBOX.enqueue(named, Message(topic="t", payload={"n": 1}, event_id="beside-a-named-cursor"))
            assert named.fetchone() == (1,)  # the application's cursor still reads its own result
        app.commit()
    assert _stored(conn) == ["beside-a-named-cursor"]


def test_enqueue_many_takes_a_cursor_too(db_url, conn):
    with psycopg.connect(db_url) as app:
        with app.cursor() as cur:
            results = OUTBOX.enqueue_many(
                cur, [Message(topic="t", payload={"n": n}, event_id=f"m-{n}") for n in range(3)]
            )
        app.rollback()
        with app.cursor() as cur:
            OUTBOX.enqueue_many(cur, [Message(topic="t", payload={"n": n}, event_id=f"m-{n}") for n in range(3)])
        app.commit()
    assert [r.duplicate for r in results] == [False, False, False]
    assert _stored(conn) == ["m-0", "m-1", "m-2"]


class _Base(DeclarativeBase):
    pass


class _Business(_Base):
    __tablename__ = "business"
    id: Mapped[int] = mapped_column(primary_key=True)


def test_an_orm_session_carries_the_message_in_its_transaction(db_url, conn, business_table):
    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        with Session(engine) as session:
            session.add(_Business(id=1))
            session.flush()
            OUTBOX.enqueue(session, Message(topic="t", payload={"n": 1}, event_id="with-1"))
            OUTBOX.enqueue_many(session, [Message(topic="t", payload={"n": 2}, event_id="with-1b")])
            session.commit()
        with Session(engine) as session:
            session.add(_Business(id=2))
            OUTBOX.enqueue(session, Message(topic="t", payload={"n": 2}, event_id="with-2"))
            session.rollback()
        with Session(engine) as session, session.begin():
            # No flush before the enqueue: the session's transaction begins with the enqueue.
            OUTBOX.enqueue(session, Message(topic="t", payload={"n": 3}, event_id="with-3"))
            session.add(_Business(id=3))
    finally:
        engine.dispose()
    assert _business(conn) == [1, 3]
    assert _stored(conn) == ["with-1", "with-1b", "with-3"]


@pytest.mark.parametrize("wrong", ["postgresql://localhost/app", object()])
def test_anything_else_is_refused_with_what_to_pass(wrong):
    with pytest.raises(TypeError, match="enqueue needs a psycopg 3 Connection or Cursor, a SQLAlchemy Connection"):
        OUTBOX.enqueue(wrong, Message(topic="t", payload={"n": 1}))


def test_an_async_session_is_refused_without_starting_its_connection(recwarn):
    """An AsyncSession (SQLAlchemy's asyncio extension) looks like a Session, but its connection() is a
    coroutine: enqueue is synchronous, so it says what it takes instead of leaving a coroutine unawaited."""

    class AsyncSessionShaped:  # the two methods enqueue looks at, as sqlalchemy.ext.asyncio defines them
        async def connection(self):
            raise AssertionError("never called")

        def get_bind(self):
            return None

    with pytest.raises(TypeError, match=r"AsyncSessionShaped is an asyncio connection: use `await outbox.enqueue_"):
        OUTBOX.enqueue(AsyncSessionShaped(), Message(topic="t", payload={"n": 1}))
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_sqlalchemy_on_psycopg2_is_refused_with_the_one_line_switch(db_url, conn):
    engine = sa.create_engine(sqlalchemy_url(db_url).replace("+psycopg://", "+psycopg2://"))
    try:
        with engine.begin() as sa_conn:
            with pytest.raises(TypeError, match=r"psycopg2.*change the engine.s URL to postgresql\+psycopg://"):
                OUTBOX.enqueue(sa_conn, Message(topic="t", payload={"n": 1}))
    finally:
        engine.dispose()
    assert _stored(conn) == []


def test_an_autocommit_connection_is_refused_unless_the_call_says_so(db_url, conn):
    from outbox_pipelines.core.errors import NoTransaction

    engine = sa.create_engine(sqlalchemy_url(db_url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as sa_conn, pytest.raises(NoTransaction, match="outside_transaction=True"):
            OUTBOX.enqueue(sa_conn, Message(topic="t", payload={"n": 1}, event_id="sa-autocommit"))
    finally:
        engine.dispose()
    with psycopg.connect(db_url, autocommit=True) as pg:
        with pytest.raises(NoTransaction, match=r"with conn.transaction\(\):"):
            OUTBOX.enqueue(pg, Message(topic="t", payload={"n": 1}, event_id="pg-autocommit"))
        with pytest.raises(NoTransaction):
            OUTBOX.enqueue_many(pg, [Message(topic="t", payload={"n": n}) for n in range(30)])  # the COPY path too
        with pg.transaction():
            OUTBOX.enqueue(pg, Message(topic="t", payload={"n": 1}, event_id="in-transaction"))
        OUTBOX.enqueue(pg, Message(topic="t", payload={"n": 1}, event_id="on-purpose"), outside_transaction=True)
    assert _stored(conn) == ["in-transaction", "on-purpose"]


def test_a_connection_begun_by_the_enqueue_commits_with_the_callers_commit(db_url, conn):
    """``engine.connect()`` with no statement before the enqueue: the message begins SQLAlchemy's transaction
    (as its autobegin would), so the caller's ``commit()`` commits it instead of finding nothing to commit."""
    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        with engine.connect() as sa_conn:
            OUTBOX.enqueue(sa_conn, Message(topic="t", payload={"n": 1}, event_id="first-statement"))
            sa_conn.commit()
    finally:
        engine.dispose()
    assert _stored(conn) == ["first-statement"]
