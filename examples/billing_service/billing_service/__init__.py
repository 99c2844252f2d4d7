"""billing_service: an example of a team's service that adopts outbox_pipelines (docs/adopting.md)."""
