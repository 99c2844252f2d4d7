-- The schema a process runs against: the versions applied (core/storage/schema_version.py; an enqueue checks
-- them in the application's own transaction, core/enqueue_guard.py) and its drift from what this version
-- defines (core/storage/schema_drift.py). Catalog reads any login may make; none can fail on a missing object.

-- name: schema_version_probe
-- What this login may read of the applied migrations, asked without an error that would abort the caller's
-- transaction: the view every login may read (migration 0015), the record itself; and the server's pid for this
-- session (a pooler reports another at connect: core/storage/pooler.py).
SELECT to_regclass('outbox_schema_version') IS NOT NULL AS view_exists,
       coalesce(has_table_privilege(to_regclass('outbox_schema_version'), 'SELECT'), false) AS view_readable,
       to_regclass('outbox_schema_migrations') IS NOT NULL AS record_exists,
       coalesce(has_table_privilege(to_regclass('outbox_schema_migrations'), 'SELECT'), false) AS record_readable,
       pg_backend_pid() AS pid

-- name: schema_versions_of_view
SELECT coalesce(array_agg(version ORDER BY version), ARRAY[]::text[]) AS versions FROM outbox_schema_version

-- name: schema_versions_of_record
SELECT coalesce(array_agg(version ORDER BY version), ARRAY[]::text[]) AS versions FROM outbox_schema_migrations

-- name: schema_functions
-- The functions of this schema the migrations define, as the database keeps them (prosrc: the text between the
-- dollar quotes).
SELECT p.proname AS name, p.prosrc AS body, p.prosecdef AS security_definer
FROM pg_proc AS p
WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY(%(names)s)

-- name: schema_table_indexes
-- Each index an outbox table must have, by the name outbox_index_name gives it: present on that table, valid.
SELECT t.table_name, s.suffix, outbox_index_name(t.table_name, s.suffix) AS index_name,
       i.indexrelid IS NOT NULL AS present, coalesce(i.indisvalid, false) AS valid
FROM unnest(%(tables)s::text[]) AS t(table_name)
CROSS JOIN unnest(%(suffixes)s::text[]) AS s(suffix)
LEFT JOIN pg_class AS c
       ON c.relname = outbox_index_name(t.table_name, s.suffix) AND c.relnamespace = current_schema()::regnamespace
LEFT JOIN pg_index AS i ON i.indexrelid = c.oid AND i.indrelid = to_regclass(quote_ident(t.table_name))
WHERE to_regclass(quote_ident(t.table_name)) IS NOT NULL
ORDER BY 1, 3

-- name: schema_existing_tables
SELECT name FROM unnest(%(tables)s::text[]) AS t(name) WHERE to_regclass(quote_ident(name)) IS NOT NULL

-- name: schema_missing_grants
-- The rights the package's roles should hold (core/storage/roles.py) that they lack: on a table (column NULL),
-- on some of its columns, USAGE on a table's id sequence, or USAGE on the schema (relation ''). Only the roles
-- granted something in this schema (db grant ran here: roles are the cluster's, a database may not use them);
-- a table that does not exist and a column a table does not have yet are left out.
WITH granted_here AS (
    SELECT r.rolname
    FROM pg_roles AS r
    WHERE r.rolname = ANY(%(roles)s)
      AND (EXISTS (SELECT 1 FROM pg_namespace AS n, aclexplode(n.nspacl) AS a
                   WHERE n.oid = current_schema()::regnamespace AND a.grantee = r.oid)
           OR EXISTS (SELECT 1 FROM pg_class AS c, aclexplode(c.relacl) AS a
                      WHERE c.relnamespace = current_schema()::regnamespace AND a.grantee = r.oid))
)
SELECT g.role, g.relation, g.privilege, g.column_name
FROM unnest(%(roles)s::text[], %(relations)s::text[], %(privileges)s::text[], %(columns)s::text[])
     AS g(role, relation, privilege, column_name)
WHERE CASE
    WHEN g.role NOT IN (SELECT rolname FROM granted_here) THEN false
    WHEN g.relation = '' THEN NOT has_schema_privilege(g.role, current_schema(), 'USAGE')
    WHEN to_regclass(quote_ident(g.relation)) IS NULL THEN false
    WHEN g.privilege = 'SEQUENCE USAGE' THEN
        pg_get_serial_sequence(quote_ident(g.relation), 'id') IS NOT NULL
        AND NOT has_sequence_privilege(g.role, pg_get_serial_sequence(quote_ident(g.relation), 'id'), 'USAGE')
    WHEN g.column_name IS NULL THEN NOT has_table_privilege(g.role, to_regclass(quote_ident(g.relation)), g.privilege)
    WHEN NOT EXISTS (SELECT 1 FROM pg_attribute AS a
                     WHERE a.attrelid = to_regclass(quote_ident(g.relation)) AND a.attname = g.column_name
                       AND NOT a.attisdropped) THEN false
    ELSE NOT has_column_privilege(g.role, to_regclass(quote_ident(g.relation)), g.column_name, g.privilege)
END
ORDER BY 1, 2, 3, 4
