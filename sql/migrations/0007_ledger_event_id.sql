-- The ledger row names the outbox message that carries its order: its event id
-- (the broker's key, "<scope>:<key>" or the bare key when the API is open). The
-- relay records an order's outcome by the settled message's event id, instead of
-- reading (ledger_scope, ledger_key) back from the message's headers.
ALTER TABLE idempo_ledger ADD COLUMN event_id text;
COMMENT ON COLUMN idempo_ledger.event_id IS 'event_id of the outbox_orders row that carries this order; the relay settles the ledger row by it';

-- Orders accepted before this migration: their outbox row carried the ledger key in
-- its headers. A database without outbox_orders has no such rows to match.
DO $$
BEGIN
    IF to_regclass('outbox_orders') IS NOT NULL THEN
        EXECUTE $backfill$
            UPDATE idempo_ledger AS l
            SET event_id = o.event_id
            FROM outbox_orders AS o
            WHERE o.headers ? 'ledger_key'
              AND o.headers->>'ledger_scope' = l.scope
              AND o.headers->>'ledger_key' = l.idempotency_key
        $backfill$;
    END IF;
END
$$;

-- One ledger row per message; rows without one (accepted before, whose message is gone) are left out.
CREATE UNIQUE INDEX idempo_ledger_by_event_id ON idempo_ledger (event_id) WHERE event_id IS NOT NULL;
