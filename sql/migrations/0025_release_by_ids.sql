-- outbox: no transaction
-- A key's release finds each released key's next message first, then writes those rows by their ids.
--
-- The release (each table's outbox_release_… function, 0010 and 0018, called by the settle of keyed messages) keeps
-- its plan for the session. Made while the table was small (a relay's first keyed batches), that plan read every
-- blocked row of the table and, for each, every released key's next message: a settle of 100 keyed messages beside
-- a backlog of 4,900 blocked ones over 100 keys read 490,000 rows (bench/results.md, "release"). The heads are now
-- found first, by key (ordered as <table>_by_ordering_key reads them), and written through the primary key by their
-- ids; the rows' own checks are written so that no partial index fits them. Only functions are replaced: no table
-- is locked, and no row is read.

CREATE OR REPLACE FUNCTION outbox_create_release(table_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format($def$
        CREATE OR REPLACE FUNCTION %1$I(keys text[], released bigint[]) RETURNS void
        LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $body$
        BEGIN
            UPDATE %2$I.%3$I AS t SET ordering_blocked = false
             WHERE t.id = ANY(ARRAY(
                       SELECT head.id
                       FROM unnest(keys) AS k(key)
                       CROSS JOIN LATERAL (
                           SELECT h.id, h.status, h.ordering_blocked FROM %2$I.%3$I AS h
                           WHERE h.ordering_key = k.key AND h.ordering_skipped_at IS NULL
                             AND h.status IN ('pending', 'sending', 'dead') AND h.id <> ALL(released)
                           ORDER BY h.ordering_key, h.id LIMIT 1) AS head
                       WHERE head.status = 'pending' AND head.ordering_blocked))
               AND (t.status = 'pending') IS TRUE AND t.ordering_blocked IS TRUE;
        END
        $body$ $def$, outbox_ordering_function('release', table_name), current_schema(), table_name);
END
$fn$;

-- 0018's, with the release of outbox_create_release: what a table made from now on gets.
CREATE OR REPLACE FUNCTION outbox_create_ordering(table_name text)
RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS ordering_key text, '
                   'ADD COLUMN IF NOT EXISTS ordering_blocked boolean NOT NULL DEFAULT false, '
                   'ADD COLUMN IF NOT EXISTS ordering_skipped_at timestamptz', table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (id) WHERE status = ''pending'' AND NOT ordering_blocked',
                   outbox_index_name(table_name, 'ready_by_id'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key, id) '
                   'WHERE status = ''pending'' AND ordering_blocked',
                   outbox_index_name(table_name, 'blocked_by_key'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key, id) WHERE ordering_key IS NOT NULL '
                   'AND ordering_skipped_at IS NULL AND status IN (''pending'', ''sending'', ''dead'')',
                   outbox_index_name(table_name, 'by_ordering_key'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key) WHERE status = ''sending'' '
                   'AND ordering_key IS NOT NULL', outbox_index_name(table_name, 'sending_by_key'), table_name);
    PERFORM outbox_create_release(table_name);
    PERFORM outbox_create_at_commit(table_name);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_ordering_at_commit', table_name);
    EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER INSERT ON %I DEFERRABLE INITIALLY DEFERRED '
                   'FOR EACH ROW WHEN (NEW.ordering_blocked) EXECUTE FUNCTION %I()',
                   'outbox_ordering_at_commit', table_name, outbox_ordering_function('at_commit', table_name));
    PERFORM outbox_create_guards(table_name);
END
$fn$;

-- Each table's own release, where this login may replace it: one another login owns (another project's table) keeps
-- its 0018 body until its owner's next upgrade.
-- outbox: run each statement this query returns
SELECT format('SELECT outbox_create_release(%L)', c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_proc AS p ON p.proname = outbox_ordering_function('release', c.relname::text)
                 AND p.pronamespace = n.oid
WHERE c.relkind = 'r' AND n.nspname = current_schema()
  AND pg_has_role(p.proowner, 'USAGE')
ORDER BY c.relname;
