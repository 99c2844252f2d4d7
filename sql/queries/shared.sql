-- Named queries over the shared tables (no table placeholder).

-- name: outbox_audit_clean_old
-- One batch of the audit's retention (docs/how-to/retention.md): the next %(limit)s rows by id after
-- %(after_id)s, a range of the primary key that never walks back over what this run deleted, and of them
-- those older than the retention deleted. The audit is written in time order, so its old rows are its
-- first ids: the cleaner moves on from last_id while a batch holds an old row, and stops at the first
-- batch with no old row (or at the end). Every batch touches at most %(limit)s rows whatever the audit
-- holds, and commits on its own: a DELETE takes row locks only, so writers of the audit never wait on it.
-- The rows of the messages still dead are kept: %(kept)s, the ids among them past %(after_id)s (at most %(limit)s:
-- those a batch can hold), taken out by EXCEPT, a hashed or sorted set difference whatever their number.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_s)s) AS cutoff
), batch AS (
    SELECT a.id, a.created_at < clock.cutoff AS old
    FROM outbox_audit AS a, clock
    WHERE a.id > %(after_id)s
    ORDER BY a.id
    LIMIT %(limit)s
), gone AS (
    DELETE FROM outbox_audit AS a
    USING (SELECT batch.id FROM batch WHERE batch.old EXCEPT SELECT unnest(%(kept)s::bigint[])) AS doomed
    WHERE a.id = doomed.id
    RETURNING a.id
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM batch) AS seen,
       (SELECT count(*) FROM batch WHERE old) AS old, (SELECT max(id) FROM batch) AS last_id

-- name: outbox_tables_list
SELECT c.relname AS table_name
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'r'
  AND n.nspname = current_schema()
  AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
ORDER BY 1

-- name: outbox_relay_try_lock
-- Single-active mode: one relay per table holds this session lock.
SELECT pg_try_advisory_lock(hashtext('outbox:' || %(table_name)s)) AS locked

-- name: outbox_relay_unlock
SELECT pg_advisory_unlock(hashtext('outbox:' || %(table_name)s)) AS unlocked

-- name: outbox_audit_insert
INSERT INTO outbox_audit (outbox_table, message_id, code, error_code, worker, detail)
SELECT %(table_name)s, id, %(code)s, %(error_code)s, %(worker)s, %(detail)s
FROM unnest(%(ids)s::bigint[]) AS id

-- name: outbox_audit_note
INSERT INTO outbox_audit (outbox_table, code, worker, detail)
VALUES (%(table_name)s, %(code)s, %(worker)s, %(detail)s)

-- name: outbox_relay_wait_lock
-- Standby: block on the single-active lock for at most lock_timeout, so the
-- standby takes over the moment the holder lets go.
SELECT set_config('lock_timeout', %(timeout_ms)s, false), pg_advisory_lock(hashtext('outbox:' || %(table_name)s))

-- name: outbox_relay_lock_timeout_reset
-- After a standby's bounded wait: statements of this session wait for locks as long as they need again.
SELECT set_config('lock_timeout', '0', false)

-- name: database_now
-- The database's clock: every "now" a decision rests on is read from here, never from the host.
SELECT now() AS now

-- name: database_seconds_until
-- How far ``at`` lies ahead of the database's clock (0 once it has passed).
SELECT greatest(extract(epoch FROM %(at)s::timestamptz - coalesce(%(now)s::timestamptz, now())), 0)::float8
       AS seconds

-- name: pg_class_find_relation
-- What an existing relation of that name is, so create-table never adopts a business table or a catalog.
-- quote_ident: the name as one identifier, never parsed as schema.name.
SELECT c.oid, c.relkind, n.nspname, n.nspname = current_schema() AS here,
       ARRAY(SELECT a.attname::text FROM pg_attribute AS a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) AS columns
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(quote_ident(%(table_name)s))

-- name: outbox_table_create
-- outbox_create_table (migration 0001) creates the table, or checks the indexes and trigger of one that exists.
SELECT outbox_create_table(%(table_name)s, %(dedup_index)s)
