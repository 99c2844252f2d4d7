-- outbox: no transaction
-- The two triggers every INSERT into an outbox table runs, with fewer PL/pgSQL steps; what they guarantee is
-- unchanged. Only functions are replaced: no table is locked, and no row is read or written.
--
-- outbox_payload_limit  (0020) each table's function measured the payload and the headers into two variables, then
--                       compared both with the limit, then summed them into json_bytes: four statements, each of
--                       which PL/pgSQL sets up again in every new transaction (one enqueue per transaction is the
--                       common case). Now json_bytes is written first (each JSON rendered once, as before) and one
--                       comparison of it with the limit stands for both: when the sum fits, each part fits. Only a
--                       row over it measures its payload again, to say which of the two is over, in the same words
--                       and with the same constraint name as before.
-- outbox_notify_insert  (0001) sent its notification with PERFORM, which PL/pgSQL runs as a query through SPI
--                       (an executor started and stopped per INSERT statement); the same call is now evaluated as
--                       an expression, and every name it uses is pg_catalog's, like the payload limit's.
--
-- Measured (bench/enqueue_vs_insert.py; bench/results.md, "Issue 47, item 4"): about 1.2 µs of server CPU less per
-- one-row INSERT transaction, out of the ~7 µs the two triggers cost. The tables' triggers still call the same
-- function names; outbox_set_payload_limit writes the new body from now on, and each existing table's function is
-- rewritten below with the limit it holds (outbox_payload_limit_of), so a table without a limit keeps none.

-- Writes table_name's payload-limit function for max_bytes (NULL: no limit, the size of each row still kept), and
-- the comment outbox_payload_limit_of reads the limit from. Creates no column and no trigger. The function runs as
-- the writer, on the writer's search_path: everything it names is pg_catalog's (0020).
CREATE OR REPLACE FUNCTION outbox_write_payload_limit(table_name text, max_bytes bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    fn text := outbox_ordering_function('payload_limit', table_name);
    refusal text := '';
BEGIN
    IF max_bytes IS NOT NULL THEN
        refusal := format($refusal$
            IF pg_catalog.int4gt(NEW.json_bytes, %1$s) THEN
                DECLARE
                    payload_bytes pg_catalog.int4 := pg_catalog.octet_length(NEW.payload::pg_catalog.text);
                    headers_bytes pg_catalog.int4 := pg_catalog.int4mi(NEW.json_bytes, payload_bytes);
                BEGIN
                    IF pg_catalog.int4gt(payload_bytes, %1$s) OR pg_catalog.int4gt(headers_bytes, %1$s) THEN
                        RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = %2$L,
                            MESSAGE = pg_catalog.format('%%s of %%s bytes over the limit of %1$s bytes of outbox table %%s',
                                CASE WHEN pg_catalog.int4gt(payload_bytes, %1$s) THEN 'payload' ELSE 'headers' END,
                                CASE WHEN pg_catalog.int4gt(payload_bytes, %1$s) THEN payload_bytes ELSE headers_bytes END,
                                %3$L),
                            HINT = 'the size of its JSON text as PostgreSQL writes it; OUTBOX_MAX_PAYLOAD_BYTES sets the '
                                   'limit (db upgrade)';
                    END IF;
                END;
            END IF;$refusal$, max_bytes, format('outbox_payload_max_%s_bytes', max_bytes), table_name);
    END IF;
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            NEW.json_bytes := pg_catalog.int4pl(pg_catalog.octet_length(NEW.payload::pg_catalog.text),
                                                pg_catalog.octet_length(NEW.headers::pg_catalog.text));%2$s
            RETURN NEW;
        END
        $body$ $fn$, fn, refusal);
    EXECUTE format('COMMENT ON FUNCTION %I() IS %L', fn,
                   format('outbox payload limit: %s bytes, table %s', coalesce(max_bytes::text, 'no limit'), table_name));
END
$$;

-- As 0020's, the function written by outbox_write_payload_limit.
CREATE OR REPLACE FUNCTION outbox_set_payload_limit(table_name text, max_bytes bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    fn text := outbox_ordering_function('payload_limit', table_name);
BEGIN
    IF max_bytes IS NOT NULL AND (max_bytes < 1 OR max_bytes > 2147483647) THEN
        RAISE EXCEPTION 'payload limit % is not a whole number of bytes from 1 to 2147483647', max_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_payload_limit_set(table_name) AND outbox_payload_limit_of(table_name) IS NOT DISTINCT FROM max_bytes THEN
        RETURN false;
    END IF;
    PERFORM outbox_write_payload_limit(table_name, max_bytes);
    IF NOT outbox_payload_limit_set(table_name) THEN
        -- A catalog change each, under the caller's lock timeout: no row is read.
        EXECUTE format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS json_bytes integer', table_name);
        EXECUTE format('CREATE TRIGGER outbox_payload_limit BEFORE INSERT ON %I FOR EACH ROW EXECUTE FUNCTION %I()',
                       table_name, fn);
    END IF;
    RETURN true;
END
$$;

-- Relays LISTEN on "outbox:<table>"; one notification per inserting statement (identical notifications in one
-- transaction are folded by PostgreSQL). The call is the IF's condition, an expression: PERFORM would run it as a
-- query. pg_notify returns no value, never NULL: the IF has nothing to do.
CREATE OR REPLACE FUNCTION outbox_notify_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.pg_notify('outbox:' OPERATOR(pg_catalog.||) TG_TABLE_NAME, '') IS NULL THEN
    END IF;
    RETURN NULL;
END
$$;

-- Each table's own function (the one its trigger calls), where this login may replace it. One another login owns
-- (another project's table, made by its upgrade) keeps its 0020 body, which checks the same: its owner's next
-- outbox_set_payload_limit writes the new one.
-- outbox: run each statement this query returns
SELECT format('SELECT outbox_write_payload_limit(%L, outbox_payload_limit_of(%L))', c.relname, c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_trigger AS tg ON tg.tgrelid = c.oid AND tg.tgname = 'outbox_payload_limit'
JOIN pg_proc AS p ON p.oid = tg.tgfoid
WHERE c.relkind = 'r' AND n.nspname = current_schema()
  AND p.proname = outbox_ordering_function('payload_limit', c.relname::text)
  AND pg_has_role(p.proowner, 'USAGE')
ORDER BY c.relname;
