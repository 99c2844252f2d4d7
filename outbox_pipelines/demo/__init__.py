"""`outbox-pipelines demo`: the orders demo on the embedded database (run) and where it keeps its data (data)."""
