-- Which project declared each outbox table: `db upgrade` and `db create-table` record it for a table nobody
-- owns yet, a relay leaves alone a table another project owns, and `db hand-over` is the one way to change it.
-- Two projects on one database can no longer relay each other's messages without a word (one marked the
-- other's messages sent to a destination of its own).
CREATE TABLE IF NOT EXISTS outbox_table_owners (
    outbox_table text        PRIMARY KEY,
    project      text        NOT NULL CHECK (length(project) BETWEEN 1 AND 200),
    declared_at  timestamptz NOT NULL DEFAULT now(),
    -- The project it was handed over from (db hand-over), and when; NULL for the first owner.
    previous     text,
    changed_at   timestamptz
);
COMMENT ON TABLE outbox_table_owners IS 'The project that declared each outbox table (db upgrade, db hand-over)';
