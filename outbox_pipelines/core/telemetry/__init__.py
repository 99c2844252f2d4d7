"""What the outbox tells metrics and trace backends as it works: Prometheus counters (metrics) and OpenTelemetry
spans and the trace context a message carries (tracing). Below every room that counts or traces."""
