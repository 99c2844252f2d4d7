-- The engine versions applied to this database, readable by every login (issue 41): an application's first
-- enqueue checks that the database has every migration its code needs, and its producer role may not read
-- outbox_schema_migrations. The view runs with its owner's rights and shows the versions alone (no checksum, no
-- time): version numbers tell a login nothing the catalogs it may read (pg_proc, pg_class) do not already.
-- A database without this view is older than this migration: that alone tells an enqueue the schema is behind.
CREATE OR REPLACE VIEW outbox_schema_version AS
    SELECT version FROM outbox_schema_migrations;
COMMENT ON VIEW outbox_schema_version IS 'The migrations applied to this database, for every login (enqueue checks)';
GRANT SELECT ON outbox_schema_version TO PUBLIC;
