-- outbox: no transaction
-- The index by tenant (0006) on the outbox tables that exist, built concurrently: the application's writes go on
-- during each build. On a database that ran 0006 before this file existed, every build finds its index made. The
-- index is the one outbox_create_table makes for a new table.

-- outbox: run each statement this query returns
SELECT format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (tenant_id, published_at, id) '
              'WHERE tenant_id IS NOT NULL', outbox_index_name(c.relname, 'by_tenant'), c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema()
  AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
ORDER BY c.relname;
