"""The NATS JetStream destination: the connection, the publish and acknowledgement (jetstream, wire) and what each
answer means (outcomes)."""
