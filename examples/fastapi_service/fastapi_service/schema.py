"""Create the service's business table (orders), if missing: python -m fastapi_service.schema

The outbox's own tables come from the outbox's CLI (README.md): outbox-pipelines db upgrade, then
outbox-pipelines db create-table orders_outbox.
"""

import asyncio

from fastapi_service.db import create_engine
from fastapi_service.models import Base


async def create_tables() -> None:
    engine = create_engine()
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(create_tables())
    print("table orders is there")
