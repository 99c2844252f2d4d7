-- outbox: no transaction
-- A keyed message's insert check reads its key through the key's index, whatever the table's statistics say.
--
-- The check (outbox_create_insert_check, 0018) looks for an earlier message of the new row's key. Its plan is kept
-- for the session. Made while a queue that was analyzed full is empty again (drained, cleaned, vacuumed: the
-- statistics still describe it full, its size says empty), that plan scanned the whole table, and a burst of keyed
-- messages then scanned it once per row as it grew: 50,000 in one enqueue_many took 43 s instead of 3 s
-- (bench/results.md, "keyed insert check"). The function now plans with sequential scans off: the check is a probe
-- of <table>_by_ordering_key at any size. Only functions are replaced: no table is locked, and no row is read.

-- As 0018's, with enable_seqscan off for the function's own statement (the caller's setting is back after it).
CREATE OR REPLACE FUNCTION outbox_create_insert_check(table_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format($def$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $body$
        BEGIN
            NEW.ordering_blocked := NEW.ordering_key IS NOT NULL
                AND EXISTS (SELECT 1 FROM %2$I.%3$I AS p
                            WHERE p.ordering_key = NEW.ordering_key AND p.ordering_skipped_at IS NULL
                              AND p.status IN ('pending', 'sending', 'dead'));
            RETURN NEW;
        END
        $body$ $def$, outbox_ordering_function('waits', table_name), current_schema(), table_name);
END
$fn$;

-- Each table's own check (the function its trigger calls), where this login may replace it: one another login owns
-- (another project's table) keeps its 0018 body until its owner's next upgrade.
-- outbox: run each statement this query returns
SELECT format('SELECT outbox_create_insert_check(%L)', c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_trigger AS tg ON tg.tgrelid = c.oid AND tg.tgname = 'outbox_ordering_on_insert'
JOIN pg_proc AS p ON p.oid = tg.tgfoid
WHERE c.relkind = 'r' AND n.nspname = current_schema()
  AND p.proname = outbox_ordering_function('waits', c.relname::text)
  AND pg_has_role(p.proowner, 'USAGE')
ORDER BY c.relname;
