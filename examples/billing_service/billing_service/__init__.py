"""billing_service: an example of a team's service that adopts outbox_pipelines (docs/tutorial/add-an-outbox.md)."""
