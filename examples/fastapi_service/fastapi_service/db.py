"""The service's database: the outbox's (OUTBOX_DATABASE_URL, or on a developer's machine the project's embedded
PostgreSQL, as the CLI and the relay use), reached through SQLAlchemy's asyncio engine on asyncpg."""

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import outbox_pipelines

POOL_SIZE = 20


def async_database_url() -> str:
    """OUTBOX_DATABASE_URL (postgresql://, postgresql+psycopg://) with asyncpg as its driver. It may hold a
    password: connect with it, never print it."""
    url = make_url(outbox_pipelines.database_url()).set(drivername="postgresql+asyncpg")
    return url.render_as_string(hide_password=False)


def create_engine() -> AsyncEngine:
    # At most POOL_SIZE connections from this process; a request beyond them waits for one, without blocking
    # the event loop (but its wait costs CPU on the loop: size the pool for the requests in flight).
    return create_async_engine(async_database_url(), pool_size=POOL_SIZE, max_overflow=0)
