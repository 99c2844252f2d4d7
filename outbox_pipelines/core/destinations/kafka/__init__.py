"""The Kafka destination (librdkafka through confluent-kafka): the destination, its idempotent producer and what
each delivery report means (outcomes)."""
