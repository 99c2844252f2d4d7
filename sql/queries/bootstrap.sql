-- Statements that run before the outbox's schema exists: the embedded server's
-- database, Dagster's storage next to it, and the migration runner's own
-- bookkeeping. core/storage/embedded.py, defs/dagster_home.py and core/storage/migrate.py read them through
-- queries.py (not OutboxTable in core/storage/, whose statements need the schema these create).

-- name: pg_database_exists
SELECT 1 FROM pg_database WHERE datname = %(database)s

-- name: pg_database_create
-- {database} is the quoted identifier (psycopg.sql), never text formatted from input.
CREATE DATABASE {database}

-- name: dagster_schema_create
-- Dagster's storage when the role may not create a database: a schema of its own in the outbox's
-- database (defs/dagster_home.py puts it on the storage URL's search_path).
CREATE SCHEMA IF NOT EXISTS dagster

-- name: dagster_schema_usable
-- Whether this login may make Dagster's tables in a schema "dagster" that exists (made by the database's owner for
-- a login that may not create schemas: CREATE SCHEMA IF NOT EXISTS asks for that right even when the schema exists).
SELECT coalesce(bool_and(has_schema_privilege(n.oid, 'CREATE') AND has_schema_privilege(n.oid, 'USAGE')), false)
       AS usable,
       current_user AS me, current_database() AS here
FROM pg_namespace AS n WHERE n.nspname = 'dagster'

-- name: outbox_schema_migrations_lock
-- A session lock serialises concurrent upgrades; the loser sees the winner's rows. Tried, never waited for in a
-- statement: a session waiting in one holds a snapshot, which the winner's concurrent index builds wait for.
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: outbox_schema_migrations_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: outbox_schema_migrations_create
CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
    version    text PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: outbox_schema_migrations_exists
SELECT to_regclass('outbox_schema_migrations') IS NOT NULL AS ok

-- name: outbox_schema_migrations_applied
SELECT version, name, checksum FROM outbox_schema_migrations

-- name: outbox_schema_migrations_record
INSERT INTO outbox_schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: server_backend_pid
-- The server's own pid for this session; a pooler reports another at connect (core/storage/pooler.py).
SELECT pg_backend_pid() AS pid

-- name: migration_lock_timeout_set
-- How long one statement of a migration may wait for a lock (core/storage/migration_safety.py): the
-- application's writers queue behind a waiting ALTER for no longer.
SELECT set_config('lock_timeout', %(ms)s, false)

-- name: migration_lock_timeout_reset
RESET lock_timeout

-- name: migration_lock_holders
-- The database's longest-open transactions but this session's: who likely held a migration's lock.
SELECT pid, application_name, state, extract(epoch FROM now() - xact_start)::float8 AS xact_s
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
ORDER BY xact_start
LIMIT 3

-- name: server_version_num
SELECT current_setting('server_version_num')::int AS num

-- name: server_version
SELECT current_setting('server_version') AS server_version

-- name: index_is_invalid
-- An index an interrupted CREATE INDEX CONCURRENTLY left behind: present, never used (core/storage/online_steps.py).
SELECT 1 AS invalid
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace AND NOT i.indisvalid

-- name: invalid_indexes
-- Drift `db status` shows: indexes of this schema an interrupted concurrent build left INVALID (never used).
SELECT c.relname AS index_name, t.relname AS table_name
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_class AS t ON t.oid = i.indrelid
WHERE c.relnamespace = current_schema()::regnamespace AND NOT i.indisvalid
ORDER BY 1

-- name: relays_started_before_the_schema
-- Live relays started before the newest engine migration was applied: they may run the previous version's code,
-- which a contract step (`db upgrade --contract`) would slow down or break.
SELECT w.worker, w.table_name, w.host, w.pid, w.started_at
FROM outbox_relay_workers AS w
WHERE w.stopped_at IS NULL
  AND w.heartbeat_at > now() - interval '2 minutes'
  AND w.started_at < (SELECT max(m.applied_at) FROM outbox_schema_migrations AS m WHERE m.version !~ '/')
ORDER BY w.started_at

-- name: migration_session_set
-- A killed `db upgrade` leaves no backend behind: the server checks every second that its client is still there,
-- also while a statement waits for a lock or for older transactions (a concurrent build), and ends it if not.
SET client_connection_check_interval = 1000

-- name: migration_blockers
-- The transactions a waiting migration statement waits for (core/storage/lock_blockers.py), each known by its
-- virtual transaction id: pg_locks shows every session's to any login, pg_stat_activity's details may be hidden.
SELECT l.pid, l.virtualxid, a.application_name, a.state,
       extract(epoch FROM now() - a.xact_start)::float8 AS xact_s
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.pid = ANY (pg_blocking_pids(%(pid)s))

-- name: migration_blockers_open
-- How many of those transactions are still open: each holds its own virtual transaction id until it ends.
SELECT count(*)::int AS open FROM pg_locks
WHERE locktype = 'virtualxid' AND mode = 'ExclusiveLock' AND granted AND virtualxid = ANY (%(virtualxids)s)
