-- The order product (seed 000/001), for a project that declares parts = ["orders"]: its outbox table, the
-- Order API's idempotency ledger and its server secret. Until 0.1.0 these came with the engine's migrations
-- 0001, 0002, 0005 and 0007 in every database; a database migrated then already has them, so each statement
-- here leaves an existing object as it is.

SELECT outbox_create_table('outbox_orders');

CREATE TABLE IF NOT EXISTS idempo_ledger (
    idempotency_key text        NOT NULL,
    -- The caller the key belongs to (API token digest); '' when the API is open.
    scope           text        NOT NULL DEFAULT '',
    request_digest  text        NOT NULL,
    status          text        NOT NULL DEFAULT 'accepted'
                    CHECK (status IN ('accepted', 'succeeded', 'failed')),
    http_status     integer,
    response        jsonb,
    result          jsonb,
    result_digest   text,
    reason          text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL DEFAULT now() + interval '48 hours',
    -- The outbox_orders message that carries the order (the broker's key): the relay settles the row by it.
    event_id        text,
    PRIMARY KEY (scope, idempotency_key)
);
CREATE INDEX IF NOT EXISTS idempo_ledger_by_expiry ON idempo_ledger (expires_at);
-- A ledger made by a version before the ledger named its message (the engine's 0007 then): its rows name
-- their message from the outbox row's headers, where the API kept the ledger key.
ALTER TABLE idempo_ledger ADD COLUMN IF NOT EXISTS event_id text;
UPDATE idempo_ledger AS l
SET event_id = o.event_id
FROM outbox_orders AS o
WHERE l.event_id IS NULL
  AND o.headers ? 'ledger_key'
  AND o.headers->>'ledger_scope' = l.scope
  AND o.headers->>'ledger_key' = l.idempotency_key;
-- One ledger row per message; rows without one (accepted before, whose message is gone) are left out.
CREATE UNIQUE INDEX IF NOT EXISTS idempo_ledger_by_event_id ON idempo_ledger (event_id) WHERE event_id IS NOT NULL;
COMMENT ON TABLE idempo_ledger IS 'Idempotency ledger of the Order API (seed 001): one row per (caller scope, Idempotency-Key), kept 48 h';
COMMENT ON COLUMN idempo_ledger.event_id IS 'event_id of the outbox_orders row that carries this order; the relay settles the ledger row by it';

-- The Order API's server secret: the key of the HMAC that scopes each caller's idempotency keys (ledger
-- scope and the key the broker sees) to its bearer token. One row per database, written by the first API
-- instance that needs it (a random 256-bit value, INSERT ... ON CONFLICT DO NOTHING), so every instance on
-- the database agrees. OUTBOX_API_SCOPE_SECRET, when set, is used instead and this row is left alone.
CREATE TABLE IF NOT EXISTS outbox_api_secret (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    secret     text        NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON outbox_api_secret FROM PUBLIC;
COMMENT ON TABLE outbox_api_secret IS 'Order API: the server secret of the per-caller key scope (HMAC-SHA256); one row';
