-- Whether a maintenance pass has anything to do, asked before a run is launched for it (defs/schedules.py):
-- an idle outbox leaves no requeue or cleaner run behind. Each mirrors the WHERE of the statements the pass
-- runs (outbox.sql, shared.sql) and reads through the indexes those use; EXISTS stops at the first row.

-- name: maintenance_requeue_due
-- What outbox_requeue_stuck, outbox_skip_dead_heads (ordering = "skip") and outbox_unblock_sweep would change:
-- sending rows past their lease or the stuck threshold (counted up to 1000), dead rows whose key a "skip"
-- table would pass over, and a blocked row with nothing before it on its key (its release was missed).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
SELECT (SELECT count(*)
        FROM (SELECT 1
              FROM {table} AS t, clock
              WHERE t.status = 'sending'
                AND (t.lease_expires_at < clock.now
                     OR t.updated_at < clock.now - make_interval(secs => %(stuck_after_s)s))
              LIMIT 1000) AS s) AS stuck,
       %(pass_over_dead)s::boolean
       AND EXISTS (SELECT 1 FROM {table} AS t
                   WHERE t.status = 'dead' AND t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL)
           AS dead_heads,
       EXISTS (SELECT 1
               FROM {table} AS t
               WHERE t.status = 'pending' AND t.ordering_blocked
                 AND {key_head}) AS orphaned_keys

-- name: maintenance_clean_due
-- What outbox_clean_sent and outbox_clean_dead would delete: a sent row past the retention, a dead row past
-- the dead rows' retention that parks no ordering key.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
SELECT EXISTS (SELECT 1 FROM {table} AS t, clock
               WHERE t.status = 'sent' AND t.published_at < clock.now - make_interval(secs => %(retention_s)s))
           AS sent,
       EXISTS (SELECT 1 FROM {table} AS t, clock
               WHERE t.status = 'dead' AND t.updated_at < clock.now - make_interval(secs => %(dead_retention_s)s)
                 AND (t.ordering_key IS NULL OR t.ordering_skipped_at IS NOT NULL)) AS dead

-- name: maintenance_audit_due
-- What outbox_audit_clean_old would delete first: an old row among the audit's first %(limit)s ids (the kept ones'
-- number and a batch), less the rows of the messages still dead, which it keeps (%(kept)s).
SELECT EXISTS (
    SELECT first_ids.id
    FROM (SELECT a.id, a.created_at FROM outbox_audit AS a ORDER BY a.id LIMIT %(limit)s) AS first_ids
    WHERE first_ids.created_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_s)s)
    EXCEPT
    SELECT unnest(%(kept)s::bigint[])
) AS due
