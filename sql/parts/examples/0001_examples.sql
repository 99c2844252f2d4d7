-- The seeds' examples, for a project that declares parts = ["examples"]: seed 003's memory writes, seed 004's
-- in-process events, seed 002's member events and the record of welcome emails its handler writes in the
-- relay's transaction. Until 0.1.0 these came with the engine's migrations 0002 and 0003 in every database;
-- a database migrated then already has them, so each statement here leaves an existing object as it is.

SELECT outbox_create_table('outbox_memory', with_dedup_index => true);
SELECT outbox_create_table('outbox_events');
SELECT outbox_create_table('outbox_members');

CREATE TABLE IF NOT EXISTS automated_email_recipients (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    member_id   text        NOT NULL,
    email       text        NOT NULL,
    email_type  text        NOT NULL,
    event_id    text        NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    -- one welcome email per member event, however often the event is delivered
    CONSTRAINT automated_email_recipients_once UNIQUE (event_id, email_type)
);
