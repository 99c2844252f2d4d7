"""POST /orders: the order's row and its outbox message, committed together or not at all.

uvicorn fastapi_service.app:app --host 127.0.0.1 --port 8000

GET /loop-stall says how late the event loop has been (the worst lateness of a 10 ms sleep since the service
started or since the last ``?reset=true``; fastapi_service/loop_stall.py): a handler that blocked the loop would
show there.
"""

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import async_sessionmaker

from fastapi_service.db import create_engine
from fastapi_service.loop_stall import LoopStallMonitor
from fastapi_service.models import Order
from outbox_pipelines import Message, Outbox

OUTBOX = Outbox("orders_outbox")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = create_engine()
    # expire_on_commit=False: the order's columns stay readable after the commit, without another query.
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    app.state.loop_stall = monitor = LoopStallMonitor()
    ticker = asyncio.create_task(monitor.run())
    # The ~100k objects the imports made live as long as the process: frozen, a full collection during
    # requests scans only what the requests made, not them.
    gc.freeze()
    try:
        yield
    finally:
        ticker.cancel()
        await engine.dispose()


app = FastAPI(title="fastapi_service", lifespan=lifespan)


class OrderIn(BaseModel):
    reference: str = Field(min_length=1, max_length=64, description="the client's order reference, unique")
    customer: str = Field(min_length=1, max_length=200)
    # Any integer: the table's CHECK (amount_cent > 0) is what refuses a non-positive amount.
    amount_cent: int


@app.post("/orders", status_code=201)
async def create_order(body: OrderIn, request: Request) -> dict[str, Any]:
    sessions = request.app.state.sessions
    try:
        async with sessions() as session, session.begin():  # the business transaction
            order = Order(reference=body.reference, customer=body.customer, amount_cent=body.amount_cent)
            session.add(order)
            await session.flush()  # the INSERT: the order's id (and its CHECK)
            message = Message(
                topic="order.created",
                payload={
                    "order_id": order.id,
                    "reference": order.reference,
                    "customer": order.customer,
                    "amount_cent": order.amount_cent,
                },
                event_id=f"order-{order.id}",
            )
            await OUTBOX.enqueue_async(session, message)  # in the same transaction
        # Leaving the block committed both (the deferred reference check ran at that COMMIT), or neither.
    except IntegrityError as exc:
        raise refused(exc, body) from None
    return {"id": order.id, "reference": order.reference, "event_id": message.event_id}


def refused(exc: IntegrityError, body: OrderIn) -> HTTPException:
    """What the database refused, as the client should hear it: the transaction wrote nothing."""
    constraint = getattr(exc.orig.__cause__, "constraint_name", None)  # asyncpg's error, under SQLAlchemy's
    if constraint == "orders_reference_unique":
        return HTTPException(409, f"an order with reference {body.reference!r} exists; nothing was written")
    if constraint == "orders_amount_positive":
        return HTTPException(422, "amount_cent must be greater than 0; nothing was written")
    return HTTPException(409, "the database refused the order; nothing was written")


@app.get("/loop-stall")
async def loop_stall(request: Request, reset: bool = False) -> dict[str, Any]:
    """The worst event-loop stall since the service started or since the last reset; ``reset=true`` starts a new
    window after reading this one."""
    monitor: LoopStallMonitor = request.app.state.loop_stall
    report = monitor.report()
    if reset:
        monitor.reset()
    return report
