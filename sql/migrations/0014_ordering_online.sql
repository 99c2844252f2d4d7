-- outbox: no transaction
-- Ordered delivery (0010) on the outbox tables that exist, without holding the application's writes: the
-- columns added one table at a time (a catalog change, under the short lock timeout), the four ordering
-- indexes built concurrently, then each table's ordering functions and trigger (outbox_create_ordering, which
-- finds its columns and indexes made). A table that has its columns is not altered, and one that has its
-- trigger is left as it is: on a database that ran 0010 before this file existed, no step takes a lock that
-- holds a write (only the concurrent builds run, and find their indexes made). The indexes are those
-- outbox_create_ordering makes for a new table, spelled out here because a concurrent build cannot run inside a
-- function; outbox_pipelines_tests/core/test_expand_contract.py compares the two catalogs.

-- outbox: run each statement this query returns
WITH outbox_table AS (
    SELECT c.relname::text AS name
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()
      AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
)
SELECT format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS ordering_key text, '
              'ADD COLUMN IF NOT EXISTS ordering_blocked boolean NOT NULL DEFAULT false, '
              'ADD COLUMN IF NOT EXISTS ordering_skipped_at timestamptz', name)
FROM outbox_table
WHERE NOT EXISTS (SELECT 1 FROM pg_attribute AS a
                  WHERE a.attrelid = to_regclass(quote_ident(name)) AND a.attname = 'ordering_skipped_at'
                    AND NOT a.attisdropped)
ORDER BY name;

-- outbox: run each statement this query returns
WITH outbox_table AS (
    SELECT c.relname::text AS name
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()
      AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
)
SELECT statement FROM outbox_table CROSS JOIN LATERAL (VALUES
    (1, format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (id) '
               'WHERE status = ''pending'' AND NOT ordering_blocked',
               outbox_index_name(name, 'ready_by_id'), name)),
    (2, format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (ordering_key, id) '
               'WHERE status = ''pending'' AND ordering_blocked',
               outbox_index_name(name, 'blocked_by_key'), name)),
    (3, format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (ordering_key, id) WHERE ordering_key IS NOT NULL '
               'AND ordering_skipped_at IS NULL AND status IN (''pending'', ''sending'', ''dead'')',
               outbox_index_name(name, 'by_ordering_key'), name)),
    (4, format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (ordering_key) '
               'WHERE status = ''sending'' AND ordering_key IS NOT NULL',
               outbox_index_name(name, 'sending_by_key'), name))
) AS build(step, statement)
ORDER BY name, step;

-- outbox: run each statement this query returns
WITH outbox_table AS (
    SELECT c.relname::text AS name
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()
      AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
)
SELECT format('SELECT outbox_create_ordering(%L)', name)
FROM outbox_table
WHERE NOT EXISTS (SELECT 1 FROM pg_trigger AS tg
                  WHERE tg.tgrelid = to_regclass(quote_ident(name)) AND tg.tgname = 'outbox_ordering_at_commit')
ORDER BY name;
