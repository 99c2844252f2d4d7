-- Backfill's dry run (core/operations/backfill_preview.py): what backfill_job would deliver again, read
-- through the same partial index as outbox_sent_in_window (published_at, id WHERE status = 'sent').

-- name: outbox_backfill_topics
-- The sent rows published in [start, end), counted per topic, the largest first.
SELECT t.topic, count(*)::bigint AS messages
FROM {table} AS t
WHERE t.status = 'sent'
  AND t.published_at >= %(start)s::timestamptz
  AND t.published_at < %(end)s::timestamptz
GROUP BY t.topic
ORDER BY messages DESC, t.topic

-- name: outbox_backfill_first
-- The first rows a backfill of [start, end) would deliver, in its order (by id).
SELECT t.id, t.event_id, t.topic, t.published_at
FROM {table} AS t
WHERE t.status = 'sent'
  AND t.published_at >= %(start)s::timestamptz
  AND t.published_at < %(end)s::timestamptz
ORDER BY t.id
LIMIT %(limit)s
