-- The on-call's rows (core/oncall/message_rows.py): what died, what blocks an ordering key, a message found by
-- its event id, ordering key or tenant; newest first, each list bounded by its limit. The payload is never read.
--
-- message_rows_of wraps one of the pickers below ({picked}: the chosen rows, columns as listed there) and adds
-- waiting_behind: for a dead head that parks its ordering key, how many later messages of its key wait. A parked
-- head is the blocked-keys rule of outbox_health_snapshot (its "parked" and "blocked" parts, what the
-- blocked_keys check and `status` count): dead, with an ordering key, not skipped; its key's waiting messages
-- are the pending ones not skipped, counted through the table's by_ordering_key index.

-- name: message_rows_of
SELECT p.id, p.event_id, p.topic, p.ordering_key, p.tenant_id, p.status, p.attempts,
       p.last_error_code AS error_code, p.last_error AS error, p.updated_at AS at,
       CASE WHEN p.status = 'dead' AND p.ordering_key IS NOT NULL AND p.ordering_skipped_at IS NULL
            THEN (SELECT count(*) FROM {table} AS w
                  WHERE w.ordering_key = p.ordering_key AND w.status = 'pending' AND w.ordering_skipped_at IS NULL)
            ELSE 0 END AS waiting_behind
FROM ({picked}) AS p
ORDER BY p.updated_at DESC, p.id DESC

-- name: message_rows_dead
-- Dead rows, the newest death first (updated_at: when the row went dead), through the dead rows' partial index.
SELECT t.id, t.event_id, t.topic, t.ordering_key, t.tenant_id, t.status, t.attempts, t.last_error_code,
       t.last_error, t.updated_at, t.ordering_skipped_at
FROM {table} AS t
WHERE t.status = 'dead'
ORDER BY t.updated_at DESC, t.id DESC
LIMIT %(limit)s

-- name: message_rows_blocked
-- The dead heads that park their ordering keys (the rule above), the newest death first.
SELECT t.id, t.event_id, t.topic, t.ordering_key, t.tenant_id, t.status, t.attempts, t.last_error_code,
       t.last_error, t.updated_at, t.ordering_skipped_at
FROM {table} AS t
WHERE t.status = 'dead' AND t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL
ORDER BY t.updated_at DESC, t.id DESC
LIMIT %(limit)s

-- name: message_rows_by_event_id
-- One message by its event id (the unique index), whatever its state; the other filters narrow it.
SELECT t.id, t.event_id, t.topic, t.ordering_key, t.tenant_id, t.status, t.attempts, t.last_error_code,
       t.last_error, t.updated_at, t.ordering_skipped_at
FROM {table} AS t
WHERE t.event_id = %(event_id)s::text
  AND (%(ordering_key)s::text IS NULL OR t.ordering_key = %(ordering_key)s::text)
  AND (%(tenant_id)s::text IS NULL OR t.tenant_id = %(tenant_id)s::text)
LIMIT %(limit)s

-- name: message_rows_by_ordering_key
-- A key's messages not yet delivered and its dead ones, through the by_ordering_key index; and its dead heads
-- already skipped, among the dead rows. A key's delivered messages are not indexed by key: not listed.
(SELECT t.id, t.event_id, t.topic, t.ordering_key, t.tenant_id, t.status, t.attempts, t.last_error_code,
        t.last_error, t.updated_at, t.ordering_skipped_at
 FROM {table} AS t
 WHERE t.ordering_key = %(ordering_key)s::text AND t.ordering_skipped_at IS NULL
   AND t.status IN ('pending', 'sending', 'dead')
   AND (%(tenant_id)s::text IS NULL OR t.tenant_id = %(tenant_id)s::text)
 ORDER BY t.id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.event_id, t.topic, t.ordering_key, t.tenant_id, t.status, t.attempts, t.last_error_code,
        t.last_error, t.updated_at, t.ordering_skipped_at
 FROM {table} AS t
 WHERE t.status = 'dead' AND t.ordering_key = %(ordering_key)s::text AND t.ordering_skipped_at IS NOT NULL
   AND (%(tenant_id)s::text IS NULL OR t.tenant_id = %(tenant_id)s::text)
 ORDER BY t.id DESC
 LIMIT %(limit)s)

-- name: message_rows_by_tenant
-- A tenant's messages through the by_tenant index (tenant, published_at, id) read backwards: those not yet
-- delivered first (no published_at), then the newest deliveries; the limit stops the scan.
SELECT t.id, t.event_id, t.topic, t.ordering_key, t.tenant_id, t.status, t.attempts, t.last_error_code,
       t.last_error, t.updated_at, t.ordering_skipped_at
FROM {table} AS t
WHERE t.tenant_id = %(tenant_id)s::text
  AND (%(ordering_key)s::text IS NULL OR t.ordering_key = %(ordering_key)s::text)
ORDER BY t.published_at DESC NULLS FIRST, t.id DESC
LIMIT %(limit)s

-- name: message_rows_sent_count
-- How many rows are kept sent, counted up to a cap through the sent rows' partial index: a page's figure at a
-- bounded cost (an exact count reads every one; `status` makes it).
SELECT count(*) AS n FROM (SELECT 1 FROM {table} AS t WHERE t.status = 'sent' LIMIT %(cap)s) AS s
