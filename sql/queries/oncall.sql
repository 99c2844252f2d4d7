-- Named queries over the on-call tables (migration 0004): relay liveness,
-- destination health, and what the alerting has told people.
-- Every time written or compared is the database's clock: %(now)s is NULL in
-- production and set only by tests that move time.

-- name: outbox_relay_workers_register
INSERT INTO outbox_relay_workers (worker, table_name, run_id, job, pid, host)
VALUES (%(worker)s, %(table_name)s, %(run_id)s, %(job)s, %(pid)s, %(host)s)
ON CONFLICT (worker) DO UPDATE
SET table_name = EXCLUDED.table_name, run_id = EXCLUDED.run_id, job = EXCLUDED.job, pid = EXCLUDED.pid,
    host = EXCLUDED.host,
    started_at = coalesce(%(now)s::timestamptz, now()), heartbeat_at = coalesce(%(now)s::timestamptz, now()),
    stopped_at = NULL, stop_reason = NULL

-- name: outbox_relay_workers_heartbeat
UPDATE outbox_relay_workers SET heartbeat_at = coalesce(%(now)s::timestamptz, now())
WHERE worker = %(worker)s AND stopped_at IS NULL

-- name: outbox_relay_workers_stop
UPDATE outbox_relay_workers SET stopped_at = coalesce(%(now)s::timestamptz, now()), stop_reason = %(reason)s
WHERE worker = %(worker)s AND stopped_at IS NULL

-- name: outbox_relay_workers_note_held
-- claim = "auto": the batch a relay is about to dispatch while it holds it in its transaction (migration
-- 0011). Committed without waiting for the WAL flush: what a database crash loses, it loses with the relay's
-- transaction, whose rows went back as they were.
WITH mode AS (SELECT set_config('synchronous_commit', 'off', true) AS commit_mode)
UPDATE outbox_relay_workers
SET held_from = %(held_from)s::bigint[], held_to = %(held_to)s::bigint[], held_attempts = %(attempts)s::int[]
FROM mode
WHERE worker = %(worker)s AND mode.commit_mode IS NOT NULL

-- name: outbox_relay_workers_held
SELECT held_from, held_to, held_attempts FROM outbox_relay_workers WHERE worker = %(worker)s AND held_from IS NOT NULL

-- name: outbox_relay_workers_silent
-- Relays that stopped heartbeating without saying goodbye: presumed dead.
SELECT worker, table_name, run_id, job, pid, host, started_at, heartbeat_at,
       extract(epoch FROM heartbeat_at - started_at)::float8 AS ran_s,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - heartbeat_at)::float8 AS silent_s
FROM outbox_relay_workers
WHERE stopped_at IS NULL
  AND heartbeat_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(silent_after_s)s)
ORDER BY heartbeat_at

-- name: outbox_relay_workers_alive
-- Relays of each table that heartbeat within %(within_s)s seconds and have not stopped (outbox_relays_alive).
SELECT table_name, count(*)::int AS alive
FROM outbox_relay_workers
WHERE stopped_at IS NULL
  AND table_name = ANY(%(tables)s::text[])
  AND heartbeat_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(within_s)s)
GROUP BY table_name

-- name: outbox_relay_workers_by_run
SELECT worker, table_name, run_id, job, pid, host, started_at, heartbeat_at, stopped_at, stop_reason
FROM outbox_relay_workers
WHERE run_id = %(run_id)s
ORDER BY started_at DESC

-- name: outbox_destination_health_failure
-- A batch in which the destination itself failed. Starts a streak or extends it,
-- and opens the circuit once the streak reaches the threshold.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
INSERT INTO outbox_destination_health AS h
    (table_name, destination, failing_since, consecutive_failures, error_codes, last_error, last_failure_at,
     circuit_opened_at, next_probe_at, updated_at)
SELECT %(table_name)s, %(destination)s, clock.now, %(failures)s, %(codes)s::jsonb, %(error)s, clock.now,
       CASE WHEN %(failures)s >= %(threshold)s THEN clock.now END,
       CASE WHEN %(failures)s >= %(threshold)s THEN clock.now + make_interval(secs => %(probe_interval_s)s) END,
       clock.now
FROM clock
ON CONFLICT (table_name) DO UPDATE
SET destination = EXCLUDED.destination,
    failing_since = coalesce(h.failing_since, (SELECT now FROM clock)),
    consecutive_failures = h.consecutive_failures + EXCLUDED.consecutive_failures,
    error_codes = CASE WHEN h.failing_since IS NULL THEN EXCLUDED.error_codes
                       ELSE (SELECT coalesce(jsonb_object_agg(k, v), '{}'::jsonb)
                             FROM (SELECT k, sum(v::int) AS v
                                   FROM (SELECT * FROM jsonb_each_text(h.error_codes)
                                         UNION ALL SELECT * FROM jsonb_each_text(EXCLUDED.error_codes)) AS e(k, v)
                                   GROUP BY k) AS s) END,
    last_error = EXCLUDED.last_error,
    last_failure_at = (SELECT now FROM clock),
    circuit_opened_at = CASE
        WHEN h.circuit_opened_at IS NOT NULL THEN h.circuit_opened_at
        WHEN h.consecutive_failures + EXCLUDED.consecutive_failures >= %(threshold)s THEN (SELECT now FROM clock) END,
    next_probe_at = CASE
        WHEN h.circuit_opened_at IS NOT NULL THEN h.next_probe_at
        WHEN h.consecutive_failures + EXCLUDED.consecutive_failures >= %(threshold)s
        THEN (SELECT now FROM clock) + make_interval(secs => %(probe_interval_s)s) END,
    updated_at = (SELECT now FROM clock)
RETURNING circuit_opened_at IS NOT NULL AS circuit_open

-- name: outbox_destination_health_success
-- A delivery succeeded: the streak (if any) is over, the circuit closes, an
-- expired throttle is lifted.
-- Written when a streak is open, and otherwise at most every SUCCESS_EVERY_S per relay
-- (core/relay/destination_health.py).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
INSERT INTO outbox_destination_health AS h (table_name, destination, last_success_at, updated_at)
SELECT %(table_name)s, %(destination)s, clock.now, clock.now FROM clock
ON CONFLICT (table_name) DO UPDATE
SET destination = EXCLUDED.destination, failing_since = NULL, consecutive_failures = 0,
    error_codes = '{}'::jsonb, last_success_at = (SELECT now FROM clock), circuit_opened_at = NULL,
    next_probe_at = NULL,
    -- a throttle that has run out is over once a delivery succeeds; one still running stays
    paused_until = CASE WHEN h.paused_until > (SELECT now FROM clock) THEN h.paused_until END,
    pause_reason = CASE WHEN h.paused_until > (SELECT now FROM clock) THEN h.pause_reason END,
    updated_at = (SELECT now FROM clock)

-- name: outbox_destination_pause
-- Throttling: every relay of the table holds off until paused_until (never shortened).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
INSERT INTO outbox_destination_health AS h (table_name, destination, paused_until, pause_reason, updated_at)
SELECT %(table_name)s, %(destination)s, clock.now + make_interval(secs => %(delay_s)s), %(reason)s, clock.now
FROM clock
ON CONFLICT (table_name) DO UPDATE
SET paused_until = GREATEST(coalesce(h.paused_until, (SELECT now FROM clock)), EXCLUDED.paused_until),
    pause_reason = EXCLUDED.pause_reason, updated_at = (SELECT now FROM clock)

-- name: outbox_destination_gate
-- Read before every claim: whether the table is paused, or its circuit open.
SELECT coalesce(%(now)s::timestamptz, now()) AS now, paused_until, pause_reason, circuit_opened_at, next_probe_at
FROM outbox_destination_health
WHERE table_name = %(table_name)s

-- name: outbox_destination_take_probe
-- While the circuit is open, one relay at a time gets to send one probe message.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
UPDATE outbox_destination_health AS h
SET next_probe_at = clock.now + make_interval(secs => %(probe_interval_s)s), updated_at = clock.now
FROM clock
WHERE h.table_name = %(table_name)s AND h.circuit_opened_at IS NOT NULL AND h.next_probe_at <= clock.now
RETURNING true AS probe

-- name: outbox_relay_problem_record
-- A table its relay group cannot relay: the problem, since when it has lasted (kept while it stays the same).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
INSERT INTO outbox_destination_health AS h (table_name, relay_problem, relay_problem_since, updated_at)
SELECT %(table_name)s, %(problem)s, clock.now, clock.now FROM clock
ON CONFLICT (table_name) DO UPDATE
SET relay_problem = EXCLUDED.relay_problem,
    relay_problem_since = CASE WHEN h.relay_problem IS NULL THEN EXCLUDED.relay_problem_since
                               ELSE h.relay_problem_since END,
    updated_at = (SELECT now FROM clock)

-- name: outbox_relay_problem_clear
-- The table relays again.
UPDATE outbox_destination_health
SET relay_problem = NULL, relay_problem_since = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE table_name = %(table_name)s AND relay_problem IS NOT NULL

-- name: outbox_paused_topics_record
-- The topics a relay of the table leaves paused now, {topic: who}; a topic paused before keeps its since.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), seen AS (
    SELECT coalesce(jsonb_object_agg(p.key, jsonb_build_object('by', p.value, 'since', to_jsonb(clock.now))),
                    '{}'::jsonb) AS paused
    FROM jsonb_each_text(%(paused)s::jsonb) AS p, clock
)
INSERT INTO outbox_destination_health AS h (table_name, paused_topics, updated_at)
SELECT %(table_name)s, seen.paused, clock.now FROM seen, clock
ON CONFLICT (table_name) DO UPDATE
SET paused_topics = (SELECT coalesce(jsonb_object_agg(e.key, CASE WHEN h.paused_topics ? e.key
                                                         THEN e.value || jsonb_build_object('since',
                                                                                            h.paused_topics -> e.key -> 'since')
                                                         ELSE e.value END), '{}'::jsonb)
                     FROM jsonb_each(EXCLUDED.paused_topics) AS e),
    updated_at = EXCLUDED.updated_at

-- name: outbox_paused_topics_read
SELECT paused_topics FROM outbox_destination_health WHERE table_name = %(table_name)s

-- name: outbox_destination_health_read
SELECT table_name, destination, failing_since, consecutive_failures, error_codes, last_error,
       relay_problem, relay_problem_since,
       last_failure_at, last_success_at, paused_until, pause_reason, circuit_opened_at, next_probe_at,
       extract(epoch FROM paused_until - coalesce(%(now)s::timestamptz, now()))::float8 AS paused_for_s,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - failing_since)::float8 AS failing_for_s
FROM outbox_destination_health
WHERE table_name = %(table_name)s

-- name: outbox_alert_state_read
SELECT alert_key, severity, started_at, notified_at, summary FROM outbox_alert_state
WHERE alert_key = ANY(%(keys)s::text[])

-- name: outbox_alert_state_write
INSERT INTO outbox_alert_state (alert_key, severity, started_at, notified_at, summary, updated_at)
VALUES (%(alert_key)s, %(severity)s, %(started_at)s, %(notified_at)s, %(summary)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (alert_key) DO UPDATE
SET severity = EXCLUDED.severity, started_at = EXCLUDED.started_at, notified_at = EXCLUDED.notified_at,
    summary = EXCLUDED.summary, updated_at = EXCLUDED.updated_at
