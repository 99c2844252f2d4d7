"""The RabbitMQ destination (publisher confirms): the connection, the destination and what each confirm or return
means (outcomes)."""
