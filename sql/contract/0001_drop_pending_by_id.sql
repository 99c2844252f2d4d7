-- outbox: no transaction
-- The contract step of 0010/0014 (run by `outbox-pipelines db upgrade --contract`, once every relay runs a
-- version that claims through <t>_ready_by_id): the previous version's claim index, <t>_pending_by_id. Kept
-- until then, because a relay of the previous version claims through it and, without it, walks the primary
-- key past every retained row (0.5 s per claim per million rows).

-- outbox: run each statement this query returns
SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %I', outbox_index_name(c.relname, 'pending_by_id'))
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema()
  AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
ORDER BY c.relname;
