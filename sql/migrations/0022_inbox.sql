-- The receiving side's inbox tables (docs/how-to/inbox.md): a consumer records each message id it handles, in its
-- own transaction, so a redelivered message's effect happens once. `db upgrade` calls this for each inbox a project
-- declares ([inboxes.NAME] in outbox.toml). One row per (consumer, message_id): the claim is one INSERT on the
-- primary key; received_at (the database's time) is what the cleaner deletes by, past the inbox's window.
-- The comment marks the table as an inbox (core/inbox/schema.py lists them by it).
CREATE FUNCTION outbox_create_inbox(inbox_name text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF inbox_name !~ '^[a-z_][a-z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'invalid inbox table name %: use lowercase letters, digits and _ (max 63, not starting with a digit)', quote_literal(inbox_name)
            USING ERRCODE = 'invalid_name';
    END IF;
    EXECUTE format($ddl$
        CREATE TABLE IF NOT EXISTS %I (
            consumer    text        NOT NULL,
            message_id  text        NOT NULL,
            received_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT %I PRIMARY KEY (consumer, message_id)
        )$ddl$, inbox_name, outbox_index_name(inbox_name, 'pkey'));
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (received_at)',
                   outbox_index_name(inbox_name, 'by_received_at'), inbox_name);
    EXECUTE format('COMMENT ON TABLE %I IS %L', inbox_name, 'outbox_pipelines inbox');
END
$$;
