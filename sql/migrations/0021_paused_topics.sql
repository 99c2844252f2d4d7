-- Topics a table's relay does not claim for now (issue 43): those of the table's settings (paused_topics) and
-- those its handlers switched off at run time (HandlerRegistry.set_enabled), as the relay last saw them, each
-- with who paused it and since when it has been paused: {"topic": {"by": "...", "since": "..."}}. The lag check
-- leaves their messages out (a pause is not lag) and `outbox-pipelines status` shows them.
ALTER TABLE outbox_destination_health ADD COLUMN paused_topics jsonb NOT NULL DEFAULT '{}'::jsonb;
