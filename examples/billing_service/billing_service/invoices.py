"""The business transaction: an invoice row and its two outbox messages, committed together.

python -m billing_service.invoices --customer acme --amount-cent 1250
"""

import argparse
import os
from importlib.resources import files

import psycopg

import outbox_pipelines
from outbox_pipelines import Message, Outbox

WEBHOOK, RECEIPTS = Outbox("billing_outbox"), Outbox("billing_receipts_outbox")


def database_url() -> str:
    """The service's database: BILLING_DATABASE_URL, else the outbox's (OUTBOX_DATABASE_URL, or on a developer's
    machine the project's embedded PostgreSQL, as the CLI and Dagster use)."""
    return os.environ.get("BILLING_DATABASE_URL") or outbox_pipelines.database_url()


def create_schema(conn: psycopg.Connection) -> None:
    conn.execute(files("billing_service").joinpath("schema.sql").read_text())


def create_invoice(conn: psycopg.Connection, customer: str, amount_cent: int) -> int:
    """One transaction: the invoice and its messages are committed together, or none of them is."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO invoices (customer, amount_cent) VALUES (%s, %s) RETURNING id", (customer, amount_cent)
        ).fetchone()
        assert row is not None
        invoice_id = int(row[0])
        payload = {"invoice_id": invoice_id, "customer": customer, "amount_cent": amount_cent}
        WEBHOOK.enqueue(
            conn,
            Message(
                topic="invoice.created",
                payload=payload,
                event_id=f"invoice-{invoice_id}",
                ordering_key=f"customer-{customer}",
            ),
        )
        RECEIPTS.enqueue(conn, Message(topic="invoice.created", payload=payload, event_id=f"receipt-{invoice_id}"))
    return invoice_id


def main() -> None:
    parser = argparse.ArgumentParser(description="Create an invoice (and its outbox messages) in one transaction.")
    parser.add_argument("--customer", required=True)
    parser.add_argument("--amount-cent", type=int, required=True)
    parser.add_argument("--create-schema", action="store_true", help="create the business tables first")
    args = parser.parse_args()
    with psycopg.connect(database_url()) as conn:
        if args.create_schema:
            create_schema(conn)
            conn.commit()
        print(f"invoice {create_invoice(conn, args.customer, args.amount_cent)} created")


if __name__ == "__main__":
    main()
