"""On-call: what people watching the outbox are told.

Health figures per table (``health``: states, lag, dead letters; what the asset checks show), alerts
that fire once and resolve once (``alerts``), relay liveness by heartbeat (``liveness``), Prometheus
metrics (``metrics``), OpenTelemetry spans (``tracing``), and the sweep a sensor runs every few seconds
(``sweep``); the sessions holding a table's ordering locks for long (``lock_holders``).
"""
