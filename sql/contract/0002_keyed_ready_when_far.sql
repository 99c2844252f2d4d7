-- outbox: no transaction
-- The contract step of 0027 (run by `outbox-pipelines db upgrade --contract`, once every relay runs a version whose
-- claims mark the keyed messages they find behind their key's head): a keyed message waits from its insert only when
-- its key's last message is near it, or its key's head is dead.
--
-- The insert check (outbox_create_insert_check: 0018, 0024) made every keyed message wait whose key held any message,
-- however far back: a backlog of keys each holding a few messages (an order's events, written minutes apart) stored
-- most of them waiting, and each then cost a second write, its release, when the message before it was delivered
-- (a keyed drain of 50,000 messages over 10,000 keys at 0.67x the same drain unkeyed: bench/keyed.py). Such a
-- message is now stored ready; the claim still hands out a keyed message only as its key's head, and marks one it
-- finds behind it (migration 0027). A message behind a dead head, or near its key's previous message, waits from its
-- insert as before. Only functions are replaced: no table is locked, and no row is read.

-- How near (in ids) a key's previous message makes a new one wait from its insert: more than the rows that relays in
-- flight hold at the default batch (4 relays of 100, each with a batch committing behind).
CREATE OR REPLACE FUNCTION outbox_ordering_near() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 1000::bigint $$;

CREATE OR REPLACE FUNCTION outbox_create_insert_check(table_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format($def$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $body$
        BEGIN
            NEW.ordering_blocked := NEW.ordering_key IS NOT NULL
                AND (EXISTS (SELECT 1 FROM %2$I.%3$I AS p
                             WHERE p.ordering_key = NEW.ordering_key
                               AND (p.ordering_key, p.id) > (NEW.ordering_key, NEW.id - %4$s)
                               AND p.ordering_skipped_at IS NULL AND p.status IN ('pending', 'sending', 'dead'))
                     OR (SELECT h.status FROM %2$I.%3$I AS h
                         WHERE h.ordering_key = NEW.ordering_key AND h.ordering_skipped_at IS NULL
                           AND h.status IN ('pending', 'sending', 'dead')
                         ORDER BY h.ordering_key, h.id LIMIT 1) IS NOT DISTINCT FROM 'dead');
            RETURN NEW;
        END
        $body$ $def$, outbox_ordering_function('waits', table_name), current_schema(), table_name,
        outbox_ordering_near());
END
$fn$;

-- Each table's own check (the function its trigger calls), where this login may replace it: one another login owns
-- (another project's table) keeps its 0024 body, which is stricter (every keyed message behind a held key waits),
-- until its owner's next upgrade.
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
