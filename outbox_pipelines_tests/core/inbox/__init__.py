"""The receiving side: the inbox (outbox_pipelines.Inbox)."""
