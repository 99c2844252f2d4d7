-- The Order API's server secret (issue 9): the key of the HMAC that scopes each
-- caller's idempotency keys (ledger scope and the key the broker sees) to its
-- bearer token. One row per database, written by the first API instance that
-- needs it (a random 256-bit value, INSERT ... ON CONFLICT DO NOTHING), so every
-- instance on the database agrees. OUTBOX_API_SCOPE_SECRET, when set, is used
-- instead and this row is left alone.
CREATE TABLE outbox_api_secret (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    secret     text        NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON outbox_api_secret FROM PUBLIC;
COMMENT ON TABLE outbox_api_secret IS 'Order API: the server secret of the per-caller key scope (HMAC-SHA256); one row';
