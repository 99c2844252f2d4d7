"""The HTTP destination and signed webhooks: the request (transport), what an answer means (outcomes) and what a
failure to get one means (failures)."""
