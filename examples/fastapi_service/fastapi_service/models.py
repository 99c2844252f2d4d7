"""The business table: orders, as SQLAlchemy models it. ``python -m fastapi_service.schema`` creates it."""

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Identity, String, UniqueConstraint, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    __table_args__ = (
        CheckConstraint("amount_cent > 0", name="orders_amount_positive"),
        # The client's reference is unique, checked at COMMIT (deferred): a repeated reference fails the
        # transaction after the outbox message was written, and the message goes with it.
        UniqueConstraint("reference", name="orders_reference_unique", deferrable=True, initially="DEFERRED"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    reference: Mapped[str] = mapped_column(String(64))
    customer: Mapped[str] = mapped_column(String(200))
    amount_cent: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
