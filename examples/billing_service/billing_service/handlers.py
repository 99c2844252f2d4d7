"""The receipts handler: writes the invoice's receipt once, whatever the number of deliveries (the event id
is the receipt's key, so a redelivery after a crash changes nothing)."""

import psycopg

from billing_service.invoices import database_url
from outbox_pipelines import ClaimedMessage, HandlerRegistry, PermanentError

registry = HandlerRegistry()


@registry.on("invoice.created")
def write_receipt(message: ClaimedMessage) -> str:
    invoice_id = message.payload.get("invoice_id")
    if not isinstance(invoice_id, int):
        raise PermanentError("invoice.created needs an integer invoice_id", code="BAD_PAYLOAD")
    with psycopg.connect(database_url()) as conn:
        conn.execute(
            "INSERT INTO receipts (event_id, invoice_id) VALUES (%s, %s) ON CONFLICT (event_id) DO NOTHING",
            (message.event_id, invoice_id),
        )
    return f"receipt:{invoice_id}"
