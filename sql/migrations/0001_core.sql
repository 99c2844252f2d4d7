-- Shared objects of every outbox: the audit trail, the wake-up trigger function
-- and the function that creates an outbox table of the canonical shape
-- (DESIGN.md §3.1).

CREATE TABLE outbox_audit (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_table  text        NOT NULL,
    message_id    bigint,
    event_id      text,
    from_status   text,
    to_status     text,
    attempts      integer,
    code          text        NOT NULL,
    error_code    text,
    worker        text,
    trace_id      text,
    detail        text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_audit_by_message ON outbox_audit (outbox_table, message_id);
-- Append-only and time-ordered: a BRIN index costs almost nothing per insert.
CREATE INDEX outbox_audit_by_time ON outbox_audit USING brin (created_at);

-- Relays LISTEN on "outbox:<table>"; one notification per inserting statement
-- (identical notifications in one transaction are folded by PostgreSQL).
CREATE FUNCTION outbox_notify_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox:' || TG_TABLE_NAME, '');
    RETURN NULL;
END
$$;

-- Index names are derived from the table name; PostgreSQL would silently cut a
-- name over 63 bytes, so long table names get a hashed stem instead.
CREATE FUNCTION outbox_index_name(table_name text, suffix text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN length(table_name) + length(suffix) + 1 <= 63 THEN table_name || '_' || suffix
        ELSE left(table_name, 62 - length(suffix) - 9) || '_' || left(md5(table_name), 8) || '_' || suffix
    END
$$;

CREATE FUNCTION outbox_create_table(table_name text, with_dedup_index boolean DEFAULT false)
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
    IF with_dedup_index THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (topic, payload_sha) WHERE status = ''sent''',
                       outbox_index_name(table_name, 'sent_by_payload'), table_name);
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_notify_insert', table_name);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_insert()',
                   'outbox_notify_insert', table_name);
END
$$;
