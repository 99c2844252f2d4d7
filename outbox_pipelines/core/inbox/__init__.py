"""The receiving side: an inbox records a message id in the consumer's own transaction, so a redelivered
message's effect happens once (docs/how-to/inbox.md); and the verification of our signed webhooks for a
receiver. Below operations (the cleaner empties an inbox past its window), beside the relay."""
