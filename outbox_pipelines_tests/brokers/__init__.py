"""Tests of the broker destinations (NATS JetStream, RabbitMQ, Kafka) against real servers the tests start."""
