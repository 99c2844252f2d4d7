-- What on-call needs to see while it happens: which relay processes are alive,
-- whether a table's destination is failing, and what the alerting has already
-- told people (so a restart neither repeats nor loses an alert).

-- One row per relay process. A relay heartbeats every few seconds; a relay
-- whose heartbeat stops without stopped_at died (SIGKILL, OOM, lost host), and
-- the rows it still holds can go back to pending at once.
CREATE TABLE outbox_relay_workers (
    worker        text        PRIMARY KEY,
    table_name    text        NOT NULL,
    run_id        text,                      -- the Dagster run, NULL for a CLI relay
    pid           integer,
    host          text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at    timestamptz,
    stop_reason   text
);
CREATE INDEX outbox_relay_workers_live ON outbox_relay_workers (table_name, heartbeat_at) WHERE stopped_at IS NULL;

-- A table's destination as its relays see it, shared by all of them: the
-- throttling pause, the circuit breaker, and the failure streak. failing_since is the start of
-- the current run of batches in which nothing was delivered because the
-- destination itself failed (connection refused, timeouts, 5xx, 401); the
-- first delivery that succeeds ends it. Failures of one message (400, handler
-- errors) and throttling (429) are not destination failures.
CREATE TABLE outbox_destination_health (
    table_name            text        PRIMARY KEY,
    destination           text,                  -- display name, credentials removed
    failing_since         timestamptz,
    consecutive_failures  integer     NOT NULL DEFAULT 0,
    error_codes           jsonb       NOT NULL DEFAULT '{}'::jsonb,  -- code -> count in this streak
    last_error            text        CHECK (length(last_error) <= 2000),
    last_failure_at       timestamptz,
    last_success_at       timestamptz,
    -- Throttling (429, Retry-After): no relay of the table, on any host, calls before this.
    paused_until          timestamptz,
    pause_reason          text,
    -- The circuit: open since (NULL = closed); while open, one probe message at a time.
    circuit_opened_at     timestamptz,
    next_probe_at         timestamptz,
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- The alerting's memory: per condition (e.g. 'check:outbox_orders:dead_letters'),
-- the severity last announced and when, so each change is told exactly once.
CREATE TABLE outbox_alert_state (
    alert_key     text        PRIMARY KEY,
    severity      text        NOT NULL CHECK (severity IN ('ok', 'warning', 'error')),
    started_at    timestamptz,
    notified_at   timestamptz,
    summary       text,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
