-- The receiving side's inbox tables (migration 0022, core/inbox/): the claim, the tables, the cleaner.

-- name: inbox_receive
-- The claim: one row per (consumer, message_id). It inserts one row the first time, none for a repeat (the
-- count in the command's tag: no RETURNING, whose row costs the claim a tenth of its time). A concurrent
-- transaction inserting the same key makes this one wait for it: then none (it committed) or one (it rolled
-- back). Positional parameters (consumer, message_id): psycopg converts no dict for them.
INSERT INTO {table} (consumer, message_id) VALUES (%s, %s)
ON CONFLICT (consumer, message_id) DO NOTHING

-- name: inbox_create
-- outbox_create_inbox (migration 0022) creates the table, or leaves the one that exists.
SELECT outbox_create_inbox(%(table_name)s)

-- name: inbox_tables_list
-- The inbox tables of the current schema: those outbox_create_inbox made (its comment marks them).
SELECT c.relname AS table_name
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'r'
  AND n.nspname = current_schema()
  AND obj_description(c.oid, 'pg_class') = 'outbox_pipelines inbox'
ORDER BY 1

-- name: inbox_clean_batch
-- Entries received longer ago than the window, at most %(limit)s of them, oldest first (the received_at index).
WITH old AS (
    SELECT consumer, message_id FROM {table}
    WHERE received_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_s)s)
    ORDER BY received_at
    LIMIT %(limit)s
)
DELETE FROM {table} AS t USING old
WHERE t.consumer = old.consumer AND t.message_id = old.message_id

-- name: inbox_clean_due
-- How many entries the cleaner would delete from this inbox, counted up to %(cap)s (the received_at index).
SELECT count(*) AS due FROM (
    SELECT 1 FROM {table}
    WHERE received_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_s)s)
    LIMIT %(cap)s
) AS old
