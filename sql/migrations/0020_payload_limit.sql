-- outbox: no transaction
-- The payload limit, held by the database too (issue 42): a producer that writes an outbox table by SQL, not
-- through enqueue, meets the limit enqueue checks (OUTBOX_MAX_PAYLOAD_BYTES). Rows of 20-50 MiB written by SQL
-- were accepted, and one relay batch of them took 867 MB.
--
-- Each outbox table gets a column and a trigger:
--
-- json_bytes            the bytes of the row's payload and headers as JSON text, as PostgreSQL writes them (what a
--                       relay reads and a receiver gets), set by the trigger when the row is written (whatever the
--                       INSERT says); NULL for a row stored before this migration. The relay's claim reads it for its
--                       byte budget (outbox_claim: a batch holds the messages that fit in the budget, one at least),
--                       with no need to read the JSON again.
-- outbox_payload_limit  BEFORE INSERT, each row: refuses a payload or headers over the table's limit with SQLSTATE
--                       check_violation, naming the constraint "outbox_payload_max_<N>_bytes" (enqueue turns it into
--                       InvalidMessage naming the limit: core/storage/payload_limit.py). Its function is the table's
--                       own, the limit written in it: outbox_set_payload_limit replaces the function to change it,
--                       which locks no table.
--
-- A trigger on INSERT, not a CHECK constraint: PostgreSQL checks every CHECK constraint on every UPDATE of a row, and
-- a relay updates each row twice (its claim and its settle), which would read a 1 MiB payload's JSON twice more
-- (measured: half the rate of such updates); a BEFORE UPDATE trigger, even on other columns, makes every UPDATE lock
-- its row once more. A message is never changed after it is written: the package's roles may not update its payload,
-- headers or json_bytes (roles.py), and the tables' owner, who may, can drop the trigger anyway. The trigger checks
-- only the rows written from then on, as a NOT VALID constraint would: rows stored before are not judged again (the
-- relay's byte budget measures them at claim, 16 of them to a batch at most), and the limit can be lowered at any
-- time.
--
-- The size is a setting, and a project's. Here, each outbox table without the trigger gets the limit `db upgrade`
-- runs with (outbox.max_payload_bytes, which it sets from OUTBOX_MAX_PAYLOAD_BYTES; 1 MiB, the library's default,
-- without it); a table another project owns gets the column and the trigger with no limit (outbox.project names the
-- project upgrading), and its own project's upgrade its limit. A table given a default smaller than what its
-- application writes would refuse those messages until the rest of the upgrade resized it. Later, `db upgrade` gives
-- each table the project owns the size it is configured with when that differs (core/storage/payload_limit.py). A
-- new table gets its limit from outbox_create_table: the one of the upgrade that creates it, else the default,
-- until `db create-table` or the next `db upgrade` gives it the configured one. Each table's column and trigger are
-- added by one short statement under the migration lock timeout (a catalog change: no row is read or written).

-- The limit table_name's trigger holds now: NULL for no limit, or no trigger (outbox_payload_limit_set).
CREATE OR REPLACE FUNCTION outbox_payload_limit_of(table_name text)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT substring(obj_description(to_regprocedure(quote_ident(outbox_ordering_function('payload_limit', table_name))
                                                     || '()'), 'pg_proc')
                     FROM '^outbox payload limit: ([0-9]+) bytes')::bigint
$$;

-- Whether table_name has the column and the trigger of this file.
CREATE OR REPLACE FUNCTION outbox_payload_limit_set(table_name text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_trigger AS tg
                   WHERE tg.tgrelid = to_regclass(quote_ident(table_name)) AND tg.tgname = 'outbox_payload_limit')
$$;

-- Gives table_name the limit max_bytes (NULL: none, the size of each row is still kept): its trigger function
-- replaced, and the column and the trigger added when it has not them yet. True when it changed anything. The
-- trigger's function runs as the writer (a producer's role), on the writer's search_path: every function, type and
-- cast it names is named with its schema (pg_catalog), so that a writer's own objects of the same names are never
-- the ones it calls (a SET search_path on the function would cost each row a settings change and back).
CREATE OR REPLACE FUNCTION outbox_set_payload_limit(table_name text, max_bytes bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    fn text := outbox_ordering_function('payload_limit', table_name);
    refusal text := '';
BEGIN
    IF max_bytes IS NOT NULL AND (max_bytes < 1 OR max_bytes > 2147483647) THEN
        RAISE EXCEPTION 'payload limit % is not a whole number of bytes from 1 to 2147483647', max_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_payload_limit_set(table_name) AND outbox_payload_limit_of(table_name) IS NOT DISTINCT FROM max_bytes THEN
        RETURN false;
    END IF;
    IF max_bytes IS NOT NULL THEN
        refusal := format($refusal$
            IF pg_catalog.int4gt(payload_bytes, %1$s) OR pg_catalog.int4gt(headers_bytes, %1$s) THEN
                RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = %2$L,
                    MESSAGE = pg_catalog.format('%%s of %%s bytes over the limit of %1$s bytes of outbox table %%s',
                        CASE WHEN pg_catalog.int4gt(payload_bytes, %1$s) THEN 'payload' ELSE 'headers' END,
                        CASE WHEN pg_catalog.int4gt(payload_bytes, %1$s) THEN payload_bytes ELSE headers_bytes END,
                        %3$L),
                    HINT = 'the size of its JSON text as PostgreSQL writes it; OUTBOX_MAX_PAYLOAD_BYTES sets the '
                           'limit (db upgrade)';
            END IF;$refusal$, max_bytes, format('outbox_payload_max_%s_bytes', max_bytes), table_name);
    END IF;
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        DECLARE
            payload_bytes pg_catalog.int4 := pg_catalog.octet_length(NEW.payload::pg_catalog.text);
            headers_bytes pg_catalog.int4 := pg_catalog.octet_length(NEW.headers::pg_catalog.text);
        BEGIN%2$s
            NEW.json_bytes := pg_catalog.int4pl(payload_bytes, headers_bytes);
            RETURN NEW;
        END
        $body$ $fn$, fn, refusal);
    EXECUTE format('COMMENT ON FUNCTION %I() IS %L', fn,
                   format('outbox payload limit: %s bytes, table %s', coalesce(max_bytes::text, 'no limit'), table_name));
    IF NOT outbox_payload_limit_set(table_name) THEN
        -- A catalog change each, under the caller's lock timeout: no row is read.
        EXECUTE format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS json_bytes integer', table_name);
        EXECUTE format('CREATE TRIGGER outbox_payload_limit BEFORE INSERT ON %I FOR EACH ROW EXECUTE FUNCTION %I()',
                       table_name, fn);
    END IF;
    RETURN true;
END
$$;

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
    -- Counts, the next due row, the oldest waiting message: every pending row, by when it is due.
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
    -- Claim order (ready rows by id, a key's later messages left out) and ordering per key.
    PERFORM outbox_create_ordering(table_name);
    -- The payload limit and the size of each row's JSON (this file): the size db upgrade runs with, else the
    -- library's default (db create-table then gives the configured one).
    IF NOT EXISTS (SELECT 1 FROM pg_trigger AS tg
                   WHERE tg.tgrelid = to_regclass(quote_ident(table_name)) AND tg.tgname = 'outbox_payload_limit') THEN
        PERFORM outbox_set_payload_limit(
            table_name, coalesce(nullif(current_setting('outbox.max_payload_bytes', true), '')::bigint, 1048576));
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_notify_insert', table_name);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_insert()',
                   'outbox_notify_insert', table_name);
END
$$;

-- outbox: run each statement this query returns
SELECT format('SELECT outbox_set_payload_limit(%L, %s)', c.relname,
              CASE WHEN EXISTS (SELECT 1 FROM outbox_table_owners AS o
                                WHERE o.outbox_table = c.relname::text
                                  AND o.project <> current_setting('outbox.project', true))
                   THEN 'NULL'
                   ELSE coalesce(nullif(current_setting('outbox.max_payload_bytes', true), '')::bigint, 1048576)::text
              END)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema()
  AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
  AND NOT EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_payload_limit')
ORDER BY c.relname;
