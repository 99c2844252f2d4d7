-- Which project owns each outbox table (migration 0013): core/storage/table_owners.py reads and writes it.

-- name: outbox_table_owners_claim
-- Record the owner of a table nobody owns yet; either way, the owner it has after.
INSERT INTO outbox_table_owners (outbox_table, project) VALUES (%(table)s, %(project)s)
ON CONFLICT (outbox_table) DO UPDATE SET project = outbox_table_owners.project
RETURNING project

-- name: outbox_table_owners_exists
-- A database not upgraded to 0013 yet has no owners: every table is anyone's, as before.
SELECT to_regclass('outbox_table_owners') IS NOT NULL AS ok

-- name: outbox_table_owners_of
SELECT outbox_table, project, declared_at, previous, changed_at
FROM outbox_table_owners
WHERE outbox_table = ANY(%(tables)s)

-- name: outbox_table_owners_all
SELECT outbox_table, project, declared_at, previous, changed_at FROM outbox_table_owners ORDER BY outbox_table

-- name: outbox_table_owners_hand_over
-- Hand a table from the project that owns it to another (db hand-over); nothing when ``from`` no longer owns it.
UPDATE outbox_table_owners
SET project = %(project)s, previous = project, changed_at = now()
WHERE outbox_table = %(table)s AND project = %(from)s
RETURNING outbox_table
