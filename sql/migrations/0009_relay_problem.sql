-- A table that its relay group cannot relay (issue 23): its handlers cannot be imported, its
-- destination cannot be built, or its relay keeps failing. The group run goes on with its other
-- tables and records the problem here, once, for the table's `relay` check and its one alert; the
-- first activation that relays again clears it.
ALTER TABLE outbox_destination_health
    ADD COLUMN relay_problem       text CHECK (length(relay_problem) <= 2000),
    ADD COLUMN relay_problem_since timestamptz;

-- The Dagster job a relay ran in (a relay group's run hosts many tables' relays): an alert about a
-- relay that died names it, so the engine need not know how the Dagster layer names its jobs.
ALTER TABLE outbox_relay_workers ADD COLUMN job text;
