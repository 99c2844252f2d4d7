-- The service's business tables (its outbox tables come from `outbox-pipelines db create-table`).
CREATE TABLE IF NOT EXISTS invoices (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer    text    NOT NULL,
    amount_cent integer NOT NULL CHECK (amount_cent > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- What the receipts handler writes: one row per invoice event, whatever the number of deliveries.
CREATE TABLE IF NOT EXISTS receipts (
    event_id   text PRIMARY KEY,
    invoice_id bigint NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
