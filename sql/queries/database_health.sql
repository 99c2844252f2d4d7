-- Named queries of the database side of the outbox (docs/how-to/retention.md): what holds vacuum back, each
-- outbox table's dead tuples and size (core/oncall/database_health.py), and the storage settings the tables
-- carry (core/storage/autovacuum.py).

-- name: vacuum_horizon_holders
-- What holds this database's xmin horizon back, the oldest first: an open transaction of this database (its
-- snapshot or its own transaction id; a walsender's for a standby's hot_standby_feedback), a prepared
-- transaction, a replication slot. Vacuum removes no row version that one of them may still see. Never a
-- statement's text (it may hold secrets or personal data in its literals): the pid, the application's name,
-- the state and how long. xmin_age (in transactions) ranks the three kinds together; held_s is unknown for
-- a slot, and for another role's session when this login may not read it (pg_read_all_stats).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), holders AS (
    SELECT 'transaction' AS kind, a.pid, a.application_name AS application, a.state, NULL::text AS name,
           greatest(age(a.backend_xid), age(a.backend_xmin)) AS xmin_age,
           extract(epoch FROM clock.now - a.xact_start)::float8 AS held_s
    FROM pg_stat_activity AS a, clock
    WHERE a.pid <> pg_backend_pid()
      AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
      AND (a.datname = current_database() OR a.backend_type = 'walsender')
      AND a.backend_type NOT IN ('autovacuum worker', 'autovacuum launcher', 'parallel worker')
    UNION ALL
    SELECT 'prepared transaction', NULL, NULL, NULL, p.gid, age(p.transaction),
           extract(epoch FROM clock.now - p.prepared)::float8
    FROM pg_prepared_xacts AS p, clock
    WHERE p.database = current_database()
    UNION ALL
    SELECT 'replication slot', s.active_pid, NULL, CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           s.slot_name::text, age(s.xmin), NULL
    FROM pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL
)
SELECT kind, pid, application, state, name, xmin_age, held_s
FROM holders
ORDER BY xmin_age DESC NULLS LAST, held_s DESC NULLS LAST
LIMIT 1

-- name: vacuum_table_stats
-- Each of the named tables of the current schema: live rows and dead tuples (the statistics'), table and
-- index bytes, the last vacuum (by hand or autovacuum).
SELECT c.relname AS table_name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       pg_table_size(c.oid) AS table_bytes, pg_indexes_size(c.oid) AS index_bytes,
       greatest(s.last_vacuum, s.last_autovacuum) AS last_vacuum_at
FROM pg_class AS c
JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.relnamespace = current_schema()::regnamespace
  AND c.relname = ANY(%(tables)s::text[])

-- name: table_storage_options
-- The storage parameters (reloptions: autovacuum_*, fillfactor, ...) each of the named tables carries now.
SELECT c.relname AS table_name, coalesce(c.reloptions, '{}'::text[]) AS options
FROM pg_class AS c
WHERE c.relnamespace = current_schema()::regnamespace
  AND c.relkind IN ('r', 'p')
  AND c.relname = ANY(%(tables)s::text[])

-- name: storage_options_lock_timeout
-- How long the ALTER TABLE ... SET (...) that follows, in this transaction, may wait for its lock (a SHARE
-- UPDATE EXCLUSIVE one: only a VACUUM or a DDL of the table holds it up, never reads or writes).
SELECT set_config('lock_timeout', %(ms)s, true)
