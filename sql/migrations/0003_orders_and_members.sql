-- Seed 002 (Ghost-style member events): its outbox table, and the record of
-- welcome emails sent, written by the handler in the handler's transaction.
SELECT outbox_create_table('outbox_members');

CREATE TABLE automated_email_recipients (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    member_id   text        NOT NULL,
    email       text        NOT NULL,
    email_type  text        NOT NULL,
    event_id    text        NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    -- one welcome email per member event, however often the event is delivered
    CONSTRAINT automated_email_recipients_once UNIQUE (event_id, email_type)
);

-- The Order API reads the ledger by (scope, key); the relay updates it by the same.
COMMENT ON TABLE idempo_ledger IS 'Idempotency ledger of the Order API (seed 001): one row per (caller scope, Idempotency-Key), kept 48 h';
