-- Named queries over idempo_ledger (seed 001). Every time they read or write is
-- coalesce(%(now)s::timestamptz, now()): the database's clock, unless a test moves it.

-- name: idempo_ledger_reserve
-- First sight of (scope, key) inserts the accepted row and its ack, with the event id of
-- the outbox message that will carry the order; a repeat returns nothing (then
-- idempo_ledger_get tells replay from conflict). So does an event id another
-- (scope, key) already holds: no arbiter is named, so either unique index makes it a
-- no-op (and the caller finds no row under its own key: the key was used).
INSERT INTO idempo_ledger (idempotency_key, scope, request_digest, status, http_status, response,
                           created_at, updated_at, expires_at, event_id)
VALUES (%(key)s, %(scope)s, %(request_digest)s, 'accepted', 201,
        jsonb_build_object('status', 'accepted', 'idempotency_key', %(key)s::text, 'order_id', %(order_id)s::text,
                           'request_digest', %(request_digest)s::text,
                           'accepted_at', to_char(coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s), %(event_id)s)
ON CONFLICT DO NOTHING
RETURNING idempotency_key, scope, request_digest, status, http_status, response, result, result_digest, reason,
          created_at, updated_at, expires_at

-- name: idempo_ledger_get
SELECT idempotency_key, scope, request_digest, status, http_status, response, result, result_digest, reason,
       created_at, updated_at, expires_at
FROM idempo_ledger
WHERE scope = %(scope)s AND idempotency_key = %(key)s

-- name: idempo_ledger_settle
-- The relay records the broker's outcome: succeeded with the ExecResult (what a
-- replay then returns), or failed with seed 001's error code (BROKER_REJECTED,
-- BROKER_TIMEOUT, BROKER_DOWN), the HTTP status of the failure and the reason.
-- Each row is found by the event id of the outbox message that carried its order
-- (idempo_ledger_by_event_id); a message without a ledger row matches nothing.
UPDATE idempo_ledger AS l
SET status = i.status,
    result = CASE WHEN i.status = 'succeeded' THEN i.result::jsonb ELSE l.result END,
    result_digest = CASE WHEN i.status = 'succeeded' THEN i.result_digest ELSE l.result_digest END,
    -- What a replay of the same request answers (with 200): the ExecResult, or the failure.
    response = CASE WHEN i.status = 'succeeded' THEN i.result::jsonb
                    ELSE jsonb_build_object('status', 'failed', 'idempotency_key', l.idempotency_key,
                                            'order_id', l.response->>'order_id',
                                            'error', coalesce(i.error, 'BROKER_REJECTED'),
                                            'reason_code', i.reason_code,
                                            'http_status', coalesce(i.http_status, 400),
                                            'reason', i.reason, 'request_digest', l.request_digest) END,
    http_status = CASE WHEN i.status = 'succeeded' THEN 200 ELSE coalesce(i.http_status, 400) END,
    reason = i.reason,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(event_ids)s::text[], %(statuses)s::text[], %(results)s::text[],
            %(result_digests)s::text[], %(reasons)s::text[], %(errors)s::text[], %(http_statuses)s::int[],
            %(reason_codes)s::text[])
     AS i(event_id, status, result, result_digest, reason, error, http_status, reason_code)
WHERE l.event_id = i.event_id AND l.status <> 'succeeded'

-- name: idempo_ledger_clean_expired
WITH doomed AS (
    SELECT scope, idempotency_key
    FROM idempo_ledger
    WHERE expires_at < coalesce(%(now)s::timestamptz, now())
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM idempo_ledger AS l
USING doomed AS d
WHERE l.scope = d.scope AND l.idempotency_key = d.idempotency_key
