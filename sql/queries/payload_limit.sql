-- The payload limit each outbox table's trigger holds in the database (migration 0020; core/storage/payload_limit.py).

-- name: payload_limit_current
-- The limit of each table of the list that exists (NULL: none), and whether it has migration 0020's trigger.
SELECT t.name AS table_name, outbox_payload_limit_of(t.name) AS max_bytes, outbox_payload_limit_set(t.name) AS has_trigger
FROM unnest(%(tables)s::text[]) AS t(name)
WHERE to_regclass(quote_ident(t.name)) IS NOT NULL
ORDER BY t.name

-- name: payload_limit_changes
-- The tables of the list that exist and whose limit is not max_bytes: those outbox_set_payload_limit changes.
SELECT t.name AS table_name
FROM unnest(%(tables)s::text[]) AS t(name)
WHERE to_regclass(quote_ident(t.name)) IS NOT NULL
  AND (NOT outbox_payload_limit_set(t.name) OR outbox_payload_limit_of(t.name) IS DISTINCT FROM %(max_bytes)s::bigint)
ORDER BY t.name

-- name: payload_limit_set
-- One table's limit, in its own short transaction under the migration lock timeout.
SELECT outbox_set_payload_limit(%(table_name)s, %(max_bytes)s) AS changed

-- name: payload_limit_present
-- Whether the database has migration 0020's functions (before it, no table has a limit).
SELECT to_regproc('outbox_set_payload_limit') IS NOT NULL AS present

-- name: migration_setting_set
-- A session setting a migration reads with current_setting (core/storage/migrate.py): 0020's outbox.max_payload_bytes
-- and outbox.project.
SELECT set_config(%(name)s, %(value)s, false)
