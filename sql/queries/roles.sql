-- The least-privilege group roles of `outbox-pipelines db grant` (core/storage/roles.py runs these).
-- "{role}", "{roles}", "{table}", "{sequence}", "{schema}" and "{columns}" are quoted identifiers,
-- and "{privileges}" / "{privilege}" are privilege keywords from core/storage/roles.py's fixed sets, all
-- composed with psycopg.sql: never text formatted from input.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s) AS found

-- name: role_create
-- A group role: nobody logs in as it; login roles are made members of it (GRANT outbox_relay TO app).
CREATE ROLE {role} NOLOGIN

-- name: role_table_exists
-- The shared tables a role is granted on, where this database has them (quote_ident: one identifier).
SELECT to_regclass(quote_ident(%(table_name)s)) IS NOT NULL AS found

-- name: role_schema_usage
GRANT USAGE ON SCHEMA {schema} TO {roles}

-- name: role_table_revoke
-- Every right the group roles hold on the table (column rights too) goes first, in the same
-- transaction as the grants that follow: a re-run converges on the declared set, never adds to it.
REVOKE ALL ON TABLE {table} FROM {roles}

-- name: role_table_grant
GRANT {privileges} ON TABLE {table} TO {role}

-- name: role_columns_grant
-- A privilege on some columns only: "{privilege}" is SELECT, INSERT or UPDATE (core/storage/roles.py's
-- fixed set). PostgreSQL then refuses a statement that writes, or reads, any other column.
GRANT {privilege} ({columns}) ON TABLE {table} TO {role}

-- name: role_id_sequence
-- The identity sequence behind an outbox table's id (PostgreSQL names it). enqueue_many's COPY
-- reserves ids from it with nextval, which needs USAGE; an INSERT's identity default needs none.
SELECT n.nspname::text AS schema_name, s.relname::text AS sequence_name
FROM pg_class AS s
JOIN pg_namespace AS n ON n.oid = s.relnamespace
WHERE s.oid = pg_get_serial_sequence(quote_ident(%(table_name)s), 'id')::regclass

-- name: role_sequence_revoke
-- As role_table_revoke, for an outbox table's id sequence ("{sequence}": schema-qualified).
REVOKE ALL ON SEQUENCE {sequence} FROM {roles}

-- name: role_sequence_grant
GRANT USAGE ON SEQUENCE {sequence} TO {role}


-- name: role_grantable
-- Whether this session may grant on the schema and on each table: only an owner (or a member of
-- the owner, or a superuser) may. Anyone else's GRANT is a mere warning that changes nothing.
SELECT n.nspname AS schema_name, pg_has_role(current_user, n.nspowner, 'USAGE') AS owns_schema, current_user AS me,
       ARRAY(SELECT c.relname::text FROM pg_class AS c
             WHERE c.relnamespace = n.oid AND c.relname = ANY(%(tables)s::text[])
               AND NOT pg_has_role(current_user, c.relowner, 'USAGE')
             ORDER BY 1) AS not_owned
FROM pg_namespace AS n
WHERE n.nspname = current_schema()
