-- Tenants (seed 004 §7): the audit records which tenant a message belongs to, and
-- every outbox table can answer per-tenant questions (and clean per tenant)
-- through an index on (tenant_id, published_at, id).

ALTER TABLE outbox_audit ADD COLUMN tenant_id text;

-- New tables get the tenant index from outbox_create_table; existing ones here.
CREATE OR REPLACE FUNCTION outbox_create_table(table_name text, with_dedup_index boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF table_name !~ '^[a-z_][a-z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'invalid outbox table name %: use lowercase letters, digits and _ (max 63, not starting with a digit)', quote_literal(table_name)
            USING ERRCODE = 'invalid_name';
    END IF;
    EXECUTE format($ddl$
        CREATE TABLE IF NOT EXISTS %I (
            id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            event_id         text        NOT NULL,
            tenant_id        text,
            topic            text        NOT NULL,
            payload          jsonb       NOT NULL,
            payload_sha      text        NOT NULL,
            headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
            status           text        NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'sending', 'sent', 'dead')),
            attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            available_at     timestamptz NOT NULL DEFAULT now(),
            locked_by        text,
            locked_at        timestamptz,
            lease_expires_at timestamptz,
            last_error       text        CHECK (length(last_error) <= 2000),
            last_error_code  text,
            result_ref       text,
            created_at       timestamptz NOT NULL DEFAULT now(),
            updated_at       timestamptz NOT NULL DEFAULT now(),
            published_at     timestamptz,
            CONSTRAINT %I UNIQUE (event_id)
        )$ddl$, table_name, outbox_index_name(table_name, 'event_id_key'));
    -- Claim order: ready rows by id. A partial index keeps the claim flat however
    -- many sent rows the table keeps.
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (id) WHERE status = ''pending''',
                   outbox_index_name(table_name, 'pending_by_id'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (available_at, id) WHERE status = ''pending''',
                   outbox_index_name(table_name, 'pending_by_available'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (lease_expires_at) WHERE status = ''sending''',
                   outbox_index_name(table_name, 'sending_by_lease'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (published_at, id) WHERE status = ''sent''',
                   outbox_index_name(table_name, 'sent_by_published'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (last_error_code, id) WHERE status = ''dead''',
                   outbox_index_name(table_name, 'dead_by_code'), table_name);
    -- Seed 004 §7: per-tenant questions (what did tenant X publish when) without a scan.
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (tenant_id, published_at, id) WHERE tenant_id IS NOT NULL',
                   outbox_index_name(table_name, 'by_tenant'), table_name);
    IF with_dedup_index THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (topic, payload_sha) WHERE status = ''sent''',
                       outbox_index_name(table_name, 'sent_by_payload'), table_name);
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_notify_insert', table_name);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_insert()',
                   'outbox_notify_insert', table_name);
END
$$;

-- The tables that exist get their index by tenant in 0016, built concurrently: here, in this transaction, each
-- build held every write to its table for as long as it took.
