-- Named queries over one outbox table. "{table}" is replaced by the quoted,
-- validated table identifier (psycopg.sql), never by string formatting of input.
-- Every time comparison uses the database clock: %(now)s is NULL in production
-- and set only by tests that move time.

-- name: outbox_insert
-- The one-row enqueue, in the application's transaction. Positional parameters (event_id, tenant_id,
-- topic, payload, payload_sha, headers, available_at): psycopg binds a tuple for less than a dict, and
-- this statement runs once per business transaction. available_at is the message's own, else the
-- test clock's now, else NULL: the database's clock.
INSERT INTO {table} (event_id, tenant_id, topic, payload, payload_sha, headers, available_at)
VALUES (%s, %s, %s, %s::jsonb, %s, %s::jsonb, coalesce(%s::timestamptz, now()))
ON CONFLICT (event_id) DO NOTHING
RETURNING id

-- name: outbox_insert_keyed
-- A message with an ordering key: it waits (ordering_blocked) when a message of its key that still holds the key is
-- near it or dead, as the insert trigger finds (migrations 0018, 0027: the producer reads no other row); the commit
-- re-checks (outbox_ordering_at_commit, migration 0010). Parameters as outbox_insert's, then the ordering key.
INSERT INTO {table} (event_id, tenant_id, topic, payload, payload_sha, headers, available_at, ordering_key)
VALUES (%s, %s, %s, %s::jsonb, %s, %s::jsonb, coalesce(%s::timestamptz, now()), %s)
ON CONFLICT (event_id) DO NOTHING
RETURNING id

-- name: outbox_insert_many
-- The text arrays are bound in binary (the b placeholders): psycopg's text form of an array quotes and escapes every
-- element, every '"' of every JSON payload, which took 30 of the 57 ms of a 1,000-message batch
-- (bench/results.md). asyncpg binds binary whatever the placeholder.
INSERT INTO {table} (event_id, tenant_id, topic, payload, payload_sha, headers, available_at)
SELECT m.event_id, m.tenant_id, m.topic, m.payload::jsonb, m.payload_sha, m.headers::jsonb,
       coalesce(m.available_at, %(now)s::timestamptz, now())
FROM unnest(%(event_ids)b::text[], %(tenant_ids)b::text[], %(topics)b::text[], %(payloads)b::text[],
            %(payload_shas)b::text[], %(headers)b::text[], %(available_ats)s::timestamptz[])
     WITH ORDINALITY AS m(event_id, tenant_id, topic, payload, payload_sha, headers, available_at, n)
ORDER BY m.n
ON CONFLICT (event_id) DO NOTHING
RETURNING id, event_id

-- name: outbox_insert_many_keyed
-- outbox_insert_many for a batch with ordering keys: a message waits when its key is held by a message near it
-- (migration 0027), such as one before it in the batch (the insert trigger sees the rows the statement inserted).
INSERT INTO {table} (event_id, tenant_id, topic, payload, payload_sha, headers, available_at, ordering_key)
SELECT m.event_id, m.tenant_id, m.topic, m.payload::jsonb, m.payload_sha, m.headers::jsonb,
       coalesce(m.available_at, %(now)s::timestamptz, now()), m.ordering_key
FROM unnest(%(event_ids)b::text[], %(tenant_ids)b::text[], %(topics)b::text[], %(payloads)b::text[],
            %(payload_shas)b::text[], %(headers)b::text[], %(available_ats)s::timestamptz[],
            %(ordering_keys)b::text[])
     WITH ORDINALITY AS m(event_id, tenant_id, topic, payload, payload_sha, headers, available_at, ordering_key, n)
ORDER BY m.n
ON CONFLICT (event_id) DO NOTHING
RETURNING id, event_id

-- name: outbox_copy_open
-- A large batch enqueue opens its savepoint (a stored event_id met by the COPY undoes the COPY
-- alone, not the caller's transaction) and reserves the ids of the rows the COPY writes (COPY
-- has no RETURNING), ascending, as one array's text (a row per id costs the client more than
-- the server). Both in one round trip: run with client-side binding, which sends the two
-- statements as one message. Every step before the COPY's first row waits on the server, which
-- is then the slower side. The sequence is looked up once: a stable function in the select
-- list would be called per row, 3x the time for 1,000.
SAVEPOINT outbox_copy_new;
WITH sequence AS MATERIALIZED (SELECT pg_get_serial_sequence(%(table_name)s, 'id')::regclass AS name)
SELECT array_agg(id ORDER BY id)::text AS ids
FROM (SELECT nextval(sequence.name) AS id FROM sequence, generate_series(1, %(count)s)) AS reserved

-- name: outbox_copy_release
RELEASE SAVEPOINT outbox_copy_new

-- name: outbox_copy_undo
-- The COPY failed (a stored event_id, a bad message found midway): nothing of it stays, and the
-- caller's transaction goes on.
ROLLBACK TO SAVEPOINT outbox_copy_new; RELEASE SAVEPOINT outbox_copy_new

-- name: outbox_copy_in
-- A large batch enqueue: COPY writes the given identity values (as INSERT ... OVERRIDING
-- SYSTEM VALUE would); available_at and the timestamps take their defaults.
COPY {table} (id, event_id, tenant_id, topic, payload, payload_sha, headers) FROM STDIN

-- name: outbox_messages_of_topic
-- outbox_pipelines.testing.enqueued: the stored messages, oldest first, of one topic or of all (NULL).
SELECT id, event_id, tenant_id, topic, payload, headers, ordering_key, status, attempts
FROM {table}
WHERE %(topic)s::text IS NULL OR topic = %(topic)s::text
ORDER BY id

-- name: outbox_find_by_event_ids
SELECT id, event_id, payload_sha FROM {table} WHERE event_id = ANY(%(event_ids)s::text[])

-- name: claim_gate_open
-- Part of both claims (outbox_claim, outbox_claim_held): with gated, a claim takes rows only while the table's
-- destination is plainly open (not paused, no throttle to end with a probe, circuit closed), so the relay needs
-- no gate read first.
(NOT %(gated)s OR NOT EXISTS (
    SELECT 1 FROM outbox_destination_health AS h
    WHERE h.table_name = %(table_name)s
      AND (h.circuit_opened_at IS NOT NULL OR h.pause_reason IS NOT NULL
           OR h.paused_until > coalesce(%(now)s::timestamptz, now()))))

-- name: key_head
-- The keyed row (alias t) is its key's head: no earlier message of its key still holds the key (pending, in
-- flight, or dead and not skipped). Part of claim_key_free and of maintenance_requeue_due. "Earlier" is written as
-- a row comparison, which only <table>_by_ordering_key (ordering_key, id) can take as its condition: a relay's kept
-- plan made on an empty table went through the primary key on "p.id < t.id", every earlier row read for each probe.
NOT EXISTS (SELECT 1 FROM {table} AS p
            WHERE p.ordering_key = t.ordering_key AND (p.ordering_key, p.id) < (t.ordering_key, t.id)
              AND p.ordering_skipped_at IS NULL AND p.status IN ('pending', 'sending', 'dead'))

-- name: claim_due
-- Part of both claims: a pending row (alias t) a claim may take, its time come aside. Not held behind an earlier
-- message of its key (ordering_blocked), nor of a paused topic. Its key's turn is claim_key_behind's and
-- claim_key_free's, checked on the rows the claim locked. Both claims read ready_by_id in id order whatever statistics their kept (generic) plan was
-- made with, two tests written so that no other plan fits:
-- - the topic is compared as an expression (t.topic || ''), which has no statistics: on a table of one topic, the
--   column's statistics made the plan expect no row to pass "<> ALL(paused topics)" and sort every due row;
-- - each claim compares available_at with its clock as "(t.available_at <= …) IS TRUE", a filter and never a
--   condition of the pending_by_available index: a plan made while the queue held a few rows read every due row
--   by that index and sorted them, for each claim of the burst that followed.
t.status = 'pending' AND NOT t.ordering_blocked
AND (t.topic || '') <> ALL(%(paused_topics)s::text[])

-- name: claim_key_behind
-- Part of both claims, over the rows claim_due found and the claim locked (alias t): a keyed message behind its key's
-- head (key_head). The claim leaves it out and returns it with no body, and the relay marks it waiting
-- (outbox_mark_waiting, migration 0027), out of ready_by_id, until its key's release lets it go. Checked after the lock, not in the scan: with relays competing, the scan reads the rows the
-- others hold too (3 in 4 with 4 relays) and skips them at the lock, and the probes for their keys were half of a
-- keyed claim (bench/keyed.py).
(t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL AND NOT {key_head})

-- name: claim_key_free
-- Part of both claims, over the locked rows not behind their key's head (claim_key_behind): a keyed message never
-- goes beside a message of its key in flight. A row left out here stays as it is (locked until the claim's
-- transaction ends).
(t.ordering_key IS NULL OR t.ordering_skipped_at IS NOT NULL
 OR NOT EXISTS (SELECT 1 FROM {table} AS f WHERE f.ordering_key = t.ordering_key AND f.status = 'sending'))

-- name: claim_byte_budget
-- Part of both claims, over their "chosen" rows (id, json_bytes): the last id the batch's byte budget takes. The
-- chosen rows, in id order, while the bytes of their payloads and headers as JSON text (json_bytes, which the
-- table's trigger keeps: migration 0020) fit in max_bytes; the first whatever its size. A row the budget leaves
-- out is not claimed. A row stored before 0020 has no json_bytes: its JSON is measured here, for the first 16
-- rows of the batch only (their ids are the lowest), so that a backlog of large old rows is not read 100 at a
-- time to take one; a batch stops before the 17th such row.
SELECT max(b.id) AS last_id
FROM (SELECT s.id, row_number() OVER w AS n, sum(s.bytes) OVER w AS total
      FROM (SELECT c.id,
                   coalesce(c.json_bytes,
                            CASE WHEN c.id <= (SELECT max(f.id) FROM (SELECT id FROM chosen ORDER BY id LIMIT 16) AS f)
                                 THEN (SELECT octet_length(o.payload::text) + octet_length(o.headers::text)
                                       FROM {table} AS o WHERE o.id = c.id)
                                 ELSE %(max_bytes)s::bigint + 1 END) AS bytes
            FROM chosen AS c OFFSET 0) AS s
      WINDOW w AS (ORDER BY s.id)) AS b
WHERE b.n = 1 OR b.total <= %(max_bytes)s

-- name: outbox_claim
-- Due pending rows, and sending rows whose lease expired (their relay died, so a worker needs no separate
-- sweep), oldest first. A re-taken row's attempt number moves on, which fences its old holder out of settling
-- it; a row already on its last attempt is left to requeue-stuck, which marks it dead.
WITH clock AS (
    -- The relay's claim (autocommit: this statement is its transaction) commits without waiting
    -- for the WAL flush. A claim a database crash loses only sends its rows again, which
    -- at-least-once delivery allows; the settle that records an outcome still waits.
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           CASE WHEN %(fast_commit)s THEN set_config('synchronous_commit', 'off', true) END AS sync_off,
           {claim_gate_open} AS gate_open
), expired AS (
    SELECT t.id, t.status AS was, t.locked_by AS holder, t.json_bytes
    FROM {table} AS t
    WHERE t.status = 'sending'
      AND t.lease_expires_at < (SELECT now FROM clock WHERE gate_open)
      AND t.attempts < %(max_attempts)s
      AND (t.topic || '') <> ALL(%(paused_topics)s::text[])
    ORDER BY t.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), due AS (
    SELECT t.id, t.status AS was, NULL::text AS holder, t.json_bytes, t.ordering_key, t.ordering_skipped_at
    FROM {table} AS t
    WHERE {claim_due}
      AND (t.available_at <= (SELECT now FROM clock WHERE sync_off IS NOT NULL OR NOT %(fast_commit)s)) IS TRUE
      AND (SELECT gate_open FROM clock)
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), seen AS (
    SELECT t.*, {claim_key_behind} AS behind FROM due AS t
), chosen AS (
    SELECT * FROM (SELECT * FROM expired
                   UNION ALL
                   SELECT t.id, t.was, t.holder, t.json_bytes FROM seen AS t
                   WHERE NOT t.behind AND {claim_key_free}) AS c
    ORDER BY id LIMIT %(limit)s
), cut AS (
    {claim_byte_budget}
), claimed AS (
    UPDATE {table} AS t
    SET status = 'sending',
        attempts = t.attempts + 1,
        locked_by = %(worker)s,
        locked_at = clock.now,
        lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        updated_at = clock.now
    FROM chosen, clock
    -- The chosen ids also as an array, the primary key's condition: a kept plan made on an emptied table read the
    -- whole table through the primary key and joined each row to chosen (seq scans off, nothing else fitted).
    WHERE t.id = ANY(ARRAY(SELECT c.id FROM chosen AS c))
      AND t.id = chosen.id AND chosen.id <= (SELECT last_id FROM cut)
    RETURNING t.id, t.event_id, t.tenant_id, t.topic, t.payload, t.payload_sha, t.headers,
              t.attempts, t.created_at, clock.now AS claimed_at, chosen.was, chosen.holder, t.ordering_key
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, worker, trace_id, detail, claimed_at)
    SELECT %(table_name)s, c.id, c.event_id, c.tenant_id, c.was, 'sending', c.attempts, 'outbox_claim',
           %(worker)s, c.headers->>'trace_id',
           CASE WHEN c.was = 'sending' THEN format('re-taken: the lease of %%s expired', c.holder) END,
           c.claimed_at
    FROM claimed AS c
    -- audit = "failures" keeps only re-takes: a claim that ends well is told by its row.
    WHERE %(audit_claims)s OR c.was = 'sending'
)
-- payload and headers as one UTF-8 JSON array [payload, headers]: the relay decodes both in one call
-- (OutboxTable's claim row factory).
SELECT id, event_id, tenant_id, topic,
       convert_to('[' || payload::text || ',' || headers::text || ']', 'UTF8') AS body,
       payload_sha, attempts, created_at, claimed_at, ordering_key
FROM claimed
UNION ALL
SELECT j.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, j.ordering_key FROM seen AS j WHERE j.behind
ORDER BY id

-- name: outbox_claim_held
-- claim = "transaction" (and "auto"): the rows outbox_claim would take from the pending ones are locked, not
-- written, inside the relay's open transaction, which the settle of the batch commits. A relay that dies leaves
-- them as they were; one that hangs is ended by the server after the lease (the transaction's own
-- idle_in_transaction_session_timeout, set here so it passes a transaction pooler too). The attempt is counted
-- when the batch settles, so the number returned is the one it will have. A held row the byte budget leaves
-- out stays locked, unchanged, until the batch's transaction ends.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           set_config('idle_in_transaction_session_timeout', %(hold_timeout_ms)s::text, true) AS hold_timeout,
           {claim_gate_open} AS gate_open
), locked AS MATERIALIZED (
    -- Only columns here: an expression in this list is computed for every row the scan reads,
    -- before the lock is tried, so with relays competing it would run for the rows they hold too
    -- (4 rows in 5 with 4 relays: measured, the text of their payloads cost the server a third more).
    SELECT t.id, t.event_id, t.tenant_id, t.topic, t.payload, t.payload_sha, t.headers, t.attempts, t.created_at,
           t.ordering_key, t.json_bytes, t.ordering_skipped_at
    FROM {table} AS t
    WHERE {claim_due}
      AND (t.available_at <= (SELECT now FROM clock WHERE hold_timeout IS NOT NULL)) IS TRUE
      AND (SELECT gate_open FROM clock)
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), seen AS MATERIALIZED (
    SELECT t.*, {claim_key_behind} AS behind FROM locked AS t
), chosen AS MATERIALIZED (
    SELECT * FROM seen AS t WHERE NOT t.behind AND {claim_key_free}
), cut AS (
    {claim_byte_budget}
)
SELECT id, event_id, tenant_id, topic,
       convert_to('[' || payload::text || ',' || headers::text || ']', 'UTF8') AS body,
       payload_sha, attempts + 1 AS attempts, created_at, (SELECT now FROM clock) AS claimed_at, ordering_key
FROM chosen
WHERE id <= (SELECT last_id FROM cut)
UNION ALL
SELECT j.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, j.ordering_key FROM seen AS j WHERE j.behind
ORDER BY id

-- name: outbox_mark_waiting
-- The rows a claim left out behind their keys' heads wait now (migration 0027); the keys of those marked, for the
-- caller to release once its transaction is over. With fast_commit (an autocommit session: this statement is its
-- transaction), its commit does not wait for the WAL flush: a mark a crash loses leaves the row ready, for the next
-- claim to mark again.
SELECT outbox_mark_waiting(%(table_name)s, %(ids)s::bigint[]) AS keys,
       CASE WHEN %(fast_commit)s THEN set_config('synchronous_commit', 'off', true) END AS commit_mode

-- name: outbox_lease_held
-- claim = "auto": a held batch (outbox_claim_held) still in dispatch after the table's `hold` is
-- leased as outbox_claim would have leased it: its rows, locked by this transaction and still
-- pending, become sending under this worker with their attempt counted, and the caller commits the
-- transaction, so a slow destination holds no transaction open and a relay that dies from here on
-- has its attempt counted. Audited as a claim (the time it was claimed, and when it was leased).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), leased AS (
    UPDATE {table} AS t
    SET status = 'sending',
        attempts = t.attempts + 1,
        locked_by = %(worker)s,
        locked_at = %(claimed_at)s::timestamptz,
        lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        updated_at = clock.now
    FROM clock
    WHERE t.id = ANY(%(ids)s::bigint[])
      AND t.status = 'pending'
    RETURNING t.id, t.event_id, t.tenant_id, t.headers, t.attempts
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, worker, trace_id, detail, claimed_at)
    SELECT %(table_name)s, l.id, l.event_id, l.tenant_id, 'pending', 'sending', l.attempts, 'outbox_claim',
           %(worker)s, l.headers->>'trace_id', 'leased: its dispatch took longer than hold',
           %(claimed_at)s::timestamptz
    FROM leased AS l
    WHERE %(audit_claims)s
)
SELECT id, attempts FROM leased ORDER BY id

-- name: settle_fence
-- Part of every settle (outbox_settle, outbox_settle_sent), over the row (alias t) and its input (alias i, whose
-- attempts is the attempt being settled): a leased row must still be this worker's at this attempt (the fencing
-- token: a relay that paused past its lease cannot settle a row another relay has since claimed); a held row
-- (held: locked by this transaction since outbox_claim_held) is still pending, its attempt counted by the settle.
t.status = CASE WHEN %(held)s THEN 'pending' ELSE 'sending' END
AND (%(held)s OR t.locked_by = %(worker)s)
AND t.attempts = i.attempts - %(held)s::int

-- name: settle_conflict_audit
-- Part of every settle and of the lease renewal: the rows it could not settle ("unsettled": id, attempts,
-- to_status, error_code, detail_prefix) are audited as conflicts, with where the row is now and who holds it.
INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status, attempts, code,
                          error_code, worker, trace_id, detail)
SELECT %(table_name)s, u.id, cur.event_id, cur.tenant_id, cur.status, u.to_status, u.attempts,
       'outbox_flush_conflict', u.error_code, %(worker)s, cur.headers->>'trace_id',
       outbox_lease_lost_detail(u.detail_prefix, cur.id IS NOT NULL, cur.status, cur.locked_by, cur.attempts)
FROM unsettled AS u
LEFT JOIN {table} AS cur ON cur.id = u.id

-- name: outbox_settle
-- One statement settles a whole batch, leased or held: sent / retry / dead rows are updated, rows whose table
-- deletes on success are deleted, and every row the fence no longer lets this settle write is audited as a
-- conflict.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), input AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
                %(delays)s::float8[], %(error_codes)s::text[], %(errors)s::text[],
                %(refs)s::text[], %(audit_codes)s::text[], %(refunds)s::boolean[])
         AS i(id, attempts, status, delay_s, error_code, error, ref, audit_code, refund)
), updated AS (
    UPDATE {table} AS t
    SET status = i.status,
        -- Throttling, and failures while the circuit is open, are not the message's fault:
        -- the attempt counted at claim is given back. (i.attempts is the attempt being settled:
        -- counted on the row at claim under a lease, written here for a held row.)
        attempts = CASE WHEN i.refund THEN i.attempts - 1 ELSE i.attempts END,
        available_at = CASE WHEN i.status = 'pending'
                            THEN clock.now + make_interval(secs => i.delay_s)
                            ELSE t.available_at END,
        locked_by = NULL,
        locked_at = NULL,
        lease_expires_at = NULL,
        last_error = i.error,
        last_error_code = i.error_code,
        result_ref = coalesce(i.ref, t.result_ref),
        published_at = CASE WHEN i.status = 'sent' THEN clock.now ELSE t.published_at END,
        -- A keyed message that dies under the table's "skip" policy lets the rest of its key go.
        ordering_skipped_at = CASE WHEN i.status = 'dead' AND %(pass_over_dead)s AND t.ordering_key IS NOT NULL
                                   THEN clock.now ELSE t.ordering_skipped_at END,
        updated_at = clock.now
    FROM input AS i, clock
    -- Rows found by primary key: joined on the input alone, the planner may scan every pending row.
    WHERE t.id = ANY(%(ids)s::bigint[])
      AND t.id = i.id
      AND {settle_fence}
    RETURNING t.id, t.event_id, i.attempts, t.headers, i.status, i.error_code, i.audit_code, t.tenant_id,
              t.ordering_key
), deleted AS (
    -- Deletions come in arrays of their own (empty unless the table deletes on success), so
    -- neither part of the statement scans the other's rows.
    DELETE FROM {table} AS t
    USING unnest(%(delete_ids)s::bigint[], %(delete_attempts)s::int[], %(delete_audit_codes)s::text[],
                 %(delete_error_codes)s::text[]) AS i(id, attempts, audit_code, error_code)
    WHERE t.id = ANY(%(delete_ids)s::bigint[])
      AND t.id = i.id
      AND {settle_fence}
    RETURNING t.id, t.event_id, i.attempts, t.headers, 'deleted'::text AS status, i.error_code, i.audit_code,
              t.tenant_id, t.ordering_key
), settled AS (
    SELECT * FROM updated UNION ALL SELECT * FROM deleted
), unsettled AS (
    SELECT i.id, i.attempts, i.status AS to_status, i.error_code, '' AS detail_prefix
    FROM (SELECT id, attempts, status, error_code FROM input
          UNION ALL
          SELECT id, attempts, 'deleted', error_code
          FROM unnest(%(delete_ids)s::bigint[], %(delete_attempts)s::int[], %(delete_error_codes)s::text[])
               AS d(id, attempts, error_code)) AS i
    WHERE i.id NOT IN (SELECT id FROM settled)
), conflicts AS (
    {settle_conflict_audit}
), audit AS (
    -- detail holds the error text of a retry or a death (capped at 2000 characters), and the destination's
    -- reference of a delivery ("ref=<broker order id>").
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, error_code, worker, trace_id, detail, claimed_at)
    SELECT %(table_name)s, s.id, s.event_id, s.tenant_id,
           CASE WHEN %(held)s THEN 'pending' ELSE 'sending' END, s.status, s.attempts, s.audit_code,
           s.error_code, %(worker)s, s.headers->>'trace_id',
           CASE WHEN s.status IN ('sent', 'deleted') THEN 'ref=' || left(i.ref, 1996)
                ELSE left(i.error, 2000) END,
           %(claimed_at)s::timestamptz
    FROM settled AS s
    LEFT JOIN input AS i ON i.id = s.id
    -- audit = "failures": a delivery leaves no audit row (the sent row keeps when it went).
    WHERE %(audit_successes)s OR s.status NOT IN ('sent', 'deleted')
), release AS (
    -- The keys these rows held and no longer hold: their next messages may go (migration 0010). Keys a
    -- committing writer held come back in ``contended``, for the relay to release again.
    SELECT CASE WHEN r.keys IS NOT NULL THEN outbox_release_keys(%(table_name)s, r.keys, r.ids) END AS contended
    FROM (SELECT array_agg(s.ordering_key) AS keys, array_agg(s.id) AS ids
          FROM settled AS s
          WHERE s.ordering_key IS NOT NULL
            AND (s.status IN ('sent', 'deleted') OR (s.status = 'dead' AND %(pass_over_dead)s))) AS r
)
SELECT s.id, r.contended FROM settled AS s CROSS JOIN release AS r

-- name: outbox_settle_sent
-- The common batch, leased or held, every message delivered with nothing more to record: the fence and the
-- audit of outbox_settle, from two arrays instead of thirteen (their parameters cost more to build than the
-- update costs to run), and the destination's references when it gave any (a broker's stream:seq or offset;
-- NULL: none), answering with the ids it could not settle.
WITH clock AS (
    -- fast_commit (a held batch, or a leased one that emptied the queue: relay/settlement.py): this
    -- statement's transaction commits without waiting for the WAL flush, as the claim does. A
    -- settle a database crash loses sends its rows again, which at-least-once allows.
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           CASE WHEN %(fast_commit)s THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
), runs AS (
    -- The batch as runs of consecutive ids at one attempt count: each run's first and last id, attempts, and
    -- where its first id sits in ids (refs are in that order; NULL refs: none). A row finds its run by range:
    -- a batch claimed in id order is one run or a few, where pairing rows to ids one by one was a nested loop
    -- of batch × batch comparisons (the planner expects one row of the table: 1 ms of a 2.4 ms settle at 100).
    SELECT * FROM unnest(%(run_first)s::bigint[], %(run_last)s::bigint[], %(run_attempts)s::int[],
                         %(run_at)s::int[]) AS i(first_id, last_id, attempts, at)
), updated AS (
    UPDATE {table} AS t
    SET status = 'sent',
        attempts = i.attempts,
        result_ref = coalesce((%(refs)s::text[])[i.at + (t.id - i.first_id)::int], t.result_ref),
        locked_by = NULL,
        locked_at = NULL,
        lease_expires_at = NULL,
        last_error = NULL,
        last_error_code = NULL,
        published_at = clock.now,
        updated_at = clock.now
    FROM runs AS i, clock
    -- Rows found by primary key: joined on the input alone, the planner may scan every pending row.
    WHERE t.id = ANY(%(ids)s::bigint[])
      AND (clock.commit_mode IS NOT NULL OR NOT %(fast_commit)s)
      AND t.id BETWEEN i.first_id AND i.last_id
      AND {settle_fence}
    RETURNING t.id, t.event_id, t.tenant_id, t.headers, i.attempts, t.ordering_key,
              (%(refs)s::text[])[i.at + (t.id - i.first_id)::int] AS ref
), unsettled AS (
    SELECT x.id, i.attempts, 'sent' AS to_status, NULL::text AS error_code, '' AS detail_prefix
    FROM unnest(%(ids)s::bigint[]) AS x(id)
    JOIN runs AS i ON x.id BETWEEN i.first_id AND i.last_id
    WHERE x.id NOT IN (SELECT id FROM updated)
), conflicts AS (
    {settle_conflict_audit}
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, worker, trace_id, detail, claimed_at)
    SELECT %(table_name)s, u.id, u.event_id, u.tenant_id, CASE WHEN %(held)s THEN 'pending' ELSE 'sending' END,
           'sent', u.attempts, %(audit_code)s, %(worker)s, u.headers->>'trace_id', 'ref=' || left(u.ref, 1996),
           %(claimed_at)s::timestamptz
    FROM updated AS u
    WHERE %(audit_successes)s
), release AS (
    -- As in outbox_settle: the keys of the delivered rows are released.
    SELECT CASE WHEN r.keys IS NOT NULL THEN outbox_release_keys(%(table_name)s, r.keys, r.ids) END AS contended
    FROM (SELECT array_agg(u.ordering_key) AS keys, array_agg(u.id) AS ids
          FROM updated AS u WHERE u.ordering_key IS NOT NULL) AS r
)
-- The ids not settled (lost leases), usually none: one row, not a row per settled message.
SELECT coalesce((SELECT array_agg(id) FROM unsettled), ARRAY[]::bigint[]) AS lost,
       (SELECT contended FROM release) AS contended

-- name: outbox_renew_leases
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts)
), renewed AS (
    UPDATE {table} AS t
    SET lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        locked_at = clock.now,
        updated_at = clock.now
    FROM input AS i, clock
    WHERE t.id = i.id
      AND t.status = 'sending'
      AND t.locked_by = %(worker)s
      AND t.attempts = i.attempts
    RETURNING t.id
), unsettled AS (
    SELECT i.id, i.attempts, 'sending' AS to_status, NULL::text AS error_code, 'renew: ' AS detail_prefix
    FROM input AS i
    WHERE i.id NOT IN (SELECT id FROM renewed)
), conflicts AS (
    {settle_conflict_audit}
)
SELECT id FROM renewed

-- name: outbox_dedup_lookup
SELECT DISTINCT ON (t.topic, t.payload_sha) t.topic, t.payload_sha, t.id, t.result_ref
FROM {table} AS t
JOIN unnest(%(topics)s::text[], %(payload_shas)s::text[]) AS k(topic, payload_sha)
  ON t.topic = k.topic AND t.payload_sha = k.payload_sha
WHERE t.status = 'sent'
ORDER BY t.topic, t.payload_sha, t.id

-- name: outbox_requeue_stuck
-- A sending row whose lease expired, that has not moved for the stuck
-- threshold, or whose holder is known to be dead, goes back to pending; one
-- that already used its last attempt goes to dead, so a message that kills its
-- worker cannot loop forever.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), stuck AS (
    SELECT t.id, t.locked_by AS previous_holder
    FROM {table} AS t, clock
    WHERE t.status = 'sending'
      AND (t.lease_expires_at < clock.now
           OR t.updated_at < clock.now - make_interval(secs => %(stuck_after_s)s)
           -- a relay known to be dead: its rows need not wait out their lease
           OR t.locked_by = %(dead_holder)s::text)
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), moved AS (
    UPDATE {table} AS t
    -- available_at is left as it was: already due, since the row was claimed.
    SET status = CASE WHEN t.attempts >= %(max_attempts)s THEN 'dead' ELSE 'pending' END,
        locked_by = NULL,
        locked_at = NULL,
        lease_expires_at = NULL,
        last_error_code = CASE WHEN t.attempts >= %(max_attempts)s THEN 'LEASE_EXPIRED'
                               ELSE t.last_error_code END,
        last_error = CASE WHEN t.attempts >= %(max_attempts)s
                          THEN format('lease held by %%s expired on the last attempt (%%s of %%s)',
                                      coalesce(stuck.previous_holder, 'nobody'), t.attempts, %(max_attempts)s)
                          ELSE t.last_error END,
        -- Dead under the table's "skip" policy: the rest of its key goes on.
        ordering_skipped_at = CASE WHEN t.attempts >= %(max_attempts)s AND %(pass_over_dead)s
                                        AND t.ordering_key IS NOT NULL
                                   THEN clock.now ELSE t.ordering_skipped_at END,
        updated_at = clock.now
    FROM stuck, clock
    WHERE t.id = stuck.id
    RETURNING t.id, t.event_id, t.attempts, t.status, t.headers, stuck.previous_holder, t.tenant_id, t.ordering_key
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, error_code, worker, trace_id, detail)
    SELECT %(table_name)s, m.id, m.event_id, m.tenant_id, 'sending', m.status, m.attempts,
           CASE WHEN m.status = 'dead' THEN 'outbox_flush_dead' ELSE 'outbox_requeue' END,
           CASE WHEN m.status = 'dead' THEN 'LEASE_EXPIRED' END,
           %(worker)s, m.headers->>'trace_id',
           format('lease of %%s expired', coalesce(m.previous_holder, 'nobody'))
    FROM moved AS m
), wake AS (
    SELECT pg_notify('outbox:' || %(table_name)s, '') WHERE EXISTS (SELECT 1 FROM moved WHERE status = 'pending')
), release AS (
    SELECT CASE WHEN r.keys IS NOT NULL THEN outbox_release_keys(%(table_name)s, r.keys, r.ids) END AS contended
    FROM (SELECT array_agg(m.ordering_key) AS keys, array_agg(m.id) AS ids
          FROM moved AS m WHERE m.status = 'dead' AND m.ordering_key IS NOT NULL AND %(pass_over_dead)s) AS r
)
SELECT m.id, m.status, m.previous_holder, r.contended FROM moved AS m LEFT JOIN wake ON true LEFT JOIN release AS r ON true

-- name: outbox_count_died_holding
-- claim = "auto": a relay that died while it held a batch in its transaction left those rows pending, their
-- attempt not counted (its transaction rolled back). It had noted their ids and attempts on its worker row:
-- the attempt is counted now, dead when it was the last, so a message that kills its relay still reaches
-- dead. A row another relay holds now, or that moved on since (settled, claimed again), is left alone.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), noted AS (
    -- runs of consecutive ids at one attempt count (outbox_relay_workers_note_held)
    SELECT * FROM unnest(%(held_from)s::bigint[], %(held_to)s::bigint[], %(attempts)s::int[])
             AS n(first_id, last_id, attempts)
), still AS (
    SELECT t.id
    FROM noted AS n
    JOIN {table} AS t ON t.id BETWEEN n.first_id AND n.last_id
    WHERE t.status = 'pending'
      AND t.attempts = n.attempts
    FOR UPDATE OF t SKIP LOCKED
), counted AS (
    UPDATE {table} AS t
    SET attempts = t.attempts + 1,
        status = CASE WHEN t.attempts + 1 >= %(max_attempts)s THEN 'dead' ELSE 'pending' END,
        last_error_code = CASE WHEN t.attempts + 1 >= %(max_attempts)s THEN 'LEASE_EXPIRED'
                               ELSE t.last_error_code END,
        last_error = format('its relay %%s died while delivering it (attempt %%s of %%s)',
                            %(dead_holder)s::text, t.attempts + 1, %(max_attempts)s),
        ordering_skipped_at = CASE WHEN t.attempts + 1 >= %(max_attempts)s AND %(pass_over_dead)s
                                        AND t.ordering_key IS NOT NULL
                                   THEN clock.now ELSE t.ordering_skipped_at END,
        updated_at = clock.now
    FROM still, clock
    WHERE t.id = still.id
    RETURNING t.id, t.event_id, t.tenant_id, t.headers, t.attempts, t.status
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, error_code, worker, trace_id, detail)
    SELECT %(table_name)s, c.id, c.event_id, c.tenant_id, 'pending', c.status, c.attempts,
           CASE WHEN c.status = 'dead' THEN 'outbox_flush_dead' ELSE 'outbox_requeue' END,
           CASE WHEN c.status = 'dead' THEN 'LEASE_EXPIRED' END,
           %(worker)s, c.headers->>'trace_id', format('its relay %%s died holding it', %(dead_holder)s::text)
    FROM counted AS c
)
SELECT id, status FROM counted

-- name: outbox_clean_sent
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), doomed AS (
    SELECT t.id
    FROM {table} AS t, clock
    WHERE t.status = 'sent'
      AND t.published_at < clock.now - make_interval(secs => %(retention_s)s)
      -- a clean-up can be scoped to one tenant (its own index)
      AND (%(tenant_id)s::text IS NULL OR t.tenant_id = %(tenant_id)s::text)
    ORDER BY t.published_at, t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), gone AS (
    DELETE FROM {table} AS t USING doomed WHERE t.id = doomed.id RETURNING t.id
), summary AS (
    SELECT count(*) AS deleted, min(id) AS min_id, max(id) AS max_id FROM gone
), audit AS (
    INSERT INTO outbox_audit (outbox_table, tenant_id, from_status, to_status, code, worker, detail)
    SELECT %(table_name)s, %(tenant_id)s::text, 'sent', 'gone', 'outbox_clean', %(worker)s,
           format('deleted %%s sent rows, ids %%s..%%s', deleted, min_id, max_id)
    FROM summary WHERE deleted > 0
)
SELECT deleted FROM summary

-- name: outbox_clean_dead
-- The dead rows' retention (docs/how-to/retention.md): one bounded batch of the rows dead for longer than
-- it (updated_at: when they died), oldest first through <t>_dead_by_code. Never a dead row that parks its
-- ordering key (ordering = "park", not skipped): its key's later messages wait for a person to replay or
-- skip it, and the blocked_keys check keeps saying so. One audit row tells what went.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), doomed AS (
    SELECT t.id
    FROM {table} AS t, clock
    WHERE t.status = 'dead'
      AND t.updated_at < clock.now - make_interval(secs => %(retention_s)s)
      AND (t.ordering_key IS NULL OR t.ordering_skipped_at IS NOT NULL)
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), gone AS (
    DELETE FROM {table} AS t USING doomed WHERE t.id = doomed.id RETURNING t.id
), summary AS (
    SELECT count(*) AS deleted, min(id) AS min_id, max(id) AS max_id FROM gone
), audit AS (
    INSERT INTO outbox_audit (outbox_table, from_status, to_status, code, worker, detail)
    SELECT %(table_name)s, 'dead', 'gone', 'outbox_clean_dead', %(worker)s,
           format('deleted %%s dead rows, ids %%s..%%s', deleted, min_id, max_id)
    FROM summary WHERE deleted > 0
)
SELECT deleted FROM summary

-- name: outbox_replay_dead
-- Matches dead rows by the filters (NULL = any). With dry_run nothing changes;
-- rows that died of BAD_REQUEST are matched but refused unless forced.
-- error_code matches case-insensitively, and 'UNKNOWN' matches rows without a
-- code (as outbox_status_dead_by_code shows them); since/until compare the time
-- of death (updated_at, set when the row went dead), returned as died_at. The audit row's detail is the
-- operator's reason ('' = none given) and the error the row died of, which the replay clears from the row.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), matched AS (
    SELECT t.id, t.event_id, t.topic, t.tenant_id, t.last_error_code, t.last_error, t.updated_at AS died_at,
           (coalesce(t.last_error_code, '') = 'BAD_REQUEST' AND NOT %(force)s) AS refused
    FROM {table} AS t
    WHERE t.status = 'dead'
      AND t.id > %(after_id)s
      AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND (%(topic)s::text IS NULL OR t.topic = %(topic)s::text)
      AND (%(tenant_id)s::text IS NULL OR t.tenant_id = %(tenant_id)s::text)
      AND (%(error_code)s::text IS NULL OR upper(coalesce(t.last_error_code, 'UNKNOWN')) = upper(%(error_code)s::text))
      AND (%(since)s::timestamptz IS NULL OR t.updated_at >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR t.updated_at < %(until)s::timestamptz)
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), replayed AS (
    UPDATE {table} AS t
    SET status = 'pending', attempts = 0, available_at = clock.now,
        last_error = NULL, last_error_code = NULL, updated_at = clock.now
    FROM matched AS m, clock
    WHERE t.id = m.id AND NOT m.refused AND NOT %(dry_run)s
    RETURNING t.id, t.headers
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              attempts, code, error_code, worker, trace_id, detail)
    SELECT %(table_name)s, m.id, m.event_id, m.tenant_id, 'dead', 'pending', 0, 'outbox_replay',
           m.last_error_code, %(worker)s, r.headers->>'trace_id',
           left(CASE WHEN %(reason)s::text = '' THEN m.last_error
                     ELSE 'replayed: ' || %(reason)s::text || coalesce(' (it had died of: ' || m.last_error || ')', '')
                END, 2000)
    FROM matched AS m JOIN replayed AS r ON r.id = m.id
), wake AS (
    SELECT pg_notify('outbox:' || %(table_name)s, '') WHERE EXISTS (SELECT 1 FROM replayed)
)
SELECT m.id, m.event_id, m.topic, m.tenant_id, m.last_error_code, m.last_error, m.died_at, m.refused,
       (r.id IS NOT NULL) AS replayed
FROM matched AS m LEFT JOIN replayed AS r ON r.id = m.id LEFT JOIN wake ON true
ORDER BY m.id

-- name: outbox_status_sent_count
SELECT count(*) AS n FROM {table} WHERE status = 'sent'

-- name: outbox_status_dead_by_code
SELECT coalesce(last_error_code, 'UNKNOWN') AS error_code, count(*) AS n
FROM {table}
WHERE status = 'dead'
GROUP BY 1
ORDER BY 2 DESC

-- name: outbox_audit_ids_of_dead
-- The audit rows of the table's messages still dead: the audit's cleaner keeps them whatever its retention, since a
-- dead message's audit is its story for the person who replays it (docs/how-to/retention.md). One probe of
-- outbox_audit_by_message per dead message, read from the dead rows' index.
SELECT coalesce(array_agg(a.id), '{{}}') AS ids
FROM {table} AS t
JOIN outbox_audit AS a ON a.outbox_table = %(table_name)s AND a.message_id = t.id
WHERE t.status = 'dead'

-- name: outbox_next_due_in
-- How long an idle relay may sleep. A paused topic's rows are not its to claim: counted, a due one
-- would wake it at once, again and again, for a claim that takes nothing.
SELECT extract(epoch FROM min(available_at) - coalesce(%(now)s::timestamptz, now()))::float8 AS next_due_in_s
FROM {table}
WHERE status = 'pending' AND NOT ordering_blocked
  AND topic <> ALL(%(paused_topics)s::text[])

-- name: outbox_sent_in_window
-- Backfill: sent rows published in [start, end), paged by id.
SELECT t.id, t.event_id, t.tenant_id, t.topic, t.payload, t.payload_sha, t.headers, t.attempts, t.created_at
FROM {table} AS t
WHERE t.status = 'sent'
  AND t.published_at >= %(start)s::timestamptz
  AND t.published_at < %(end)s::timestamptz
  AND t.id > %(after_id)s
ORDER BY t.id
LIMIT %(limit)s

-- name: outbox_ready_probe
-- One table's part of a relay group's poll for its quiet tables (core/relay/group.py), joined with
-- UNION ALL into one statement: the table's name when a pending row outside its paused topics is
-- due now, or a sending row's lease expired (its relay died: the activation's relay takes it back with
-- outbox_requeue_stuck, as every relay does). {name} and {paused} are literals composed with psycopg.sql;
-- EXISTS stops at the first row.
SELECT {name}::text AS table_name
WHERE EXISTS (SELECT 1 FROM {table}
              WHERE status = 'pending' AND NOT ordering_blocked AND available_at <= now()
                AND topic <> ALL({paused}::text[]))
   OR EXISTS (SELECT 1 FROM {table} WHERE status = 'sending' AND lease_expires_at < now())

-- name: outbox_ready_count
SELECT count(*) AS ready
FROM {table}
WHERE status = 'pending' AND NOT ordering_blocked AND available_at <= coalesce(%(now)s::timestamptz, now())
  AND topic <> ALL(%(paused_topics)s::text[])

-- name: outbox_release_unsent
-- Rows this worker claimed but never handed to the destination (a prefetched
-- batch when the table is rate-limited) go back to pending with their attempt
-- given back; fenced like every settle.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts)
), released AS (
    UPDATE {table} AS t
    SET status = 'pending', attempts = t.attempts - 1, locked_by = NULL, locked_at = NULL,
        lease_expires_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
    FROM input AS i
    WHERE t.id = i.id AND t.status = 'sending' AND t.locked_by = %(worker)s AND t.attempts = i.attempts
    RETURNING t.id, t.event_id, t.attempts, t.headers, t.tenant_id
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status, attempts,
                              code, worker, trace_id, detail)
    SELECT %(table_name)s, r.id, r.event_id, r.tenant_id, 'sending', 'pending', r.attempts, 'outbox_release',
           %(worker)s,
           r.headers->>'trace_id', %(reason)s
    FROM released AS r
)
SELECT id FROM released

-- name: outbox_held_by
SELECT count(*) AS held FROM {table} WHERE status = 'sending' AND locked_by = %(worker)s

-- name: outbox_health_snapshot
-- What the checks read, in one statement whose cost does not grow with the sent
-- rows a table keeps: waiting, in-flight and dead rows come from their partial
-- indexes, the delivery lag (created → delivered, for the metrics and `status`)
-- from at most %(sample)s of the newest deliveries and the oldest waiting messages.
--
-- What the lag check grades is lag_now: the messages waiting now (pending and
-- due, not held behind an earlier message of their key; or in flight), each
-- timed from when it became due (available_at: a retry at its backoff's end, a
-- replay at the replay), the oldest and the p95 of at most %(sample)s of the
-- oldest. Nothing waiting is 0, whatever the window's deliveries took: a short
-- outage or a replayed old message does not keep the check red after it.
-- Pending messages of %(paused_topics)s (paused on purpose) are not lag: they
-- are counted aside (paused_waiting, paused_oldest_s) and left out of lag_now.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), waiting AS (
    SELECT count(*) FILTER (WHERE t.attempts = 0) AS pending,
           count(*) FILTER (WHERE t.attempts > 0) AS retrying,
           count(*) FILTER (WHERE t.available_at <= clock.now) AS ready,
           count(*) FILTER (WHERE t.available_at <= clock.now AND NOT t.ordering_blocked
                            AND t.topic <> ALL(%(paused_topics)s::text[])) AS due,
           min(t.available_at) FILTER (WHERE t.available_at <= clock.now AND NOT t.ordering_blocked
                                       AND t.topic <> ALL(%(paused_topics)s::text[])) AS oldest_due_at,
           count(*) FILTER (WHERE t.topic = ANY(%(paused_topics)s::text[])) AS paused,
           extract(epoch FROM clock.now - min(t.created_at) FILTER (WHERE t.topic = ANY(%(paused_topics)s::text[])))::float8
               AS paused_oldest_s,
           extract(epoch FROM clock.now - min(t.created_at))::float8 AS oldest_waiting_age_s,
           extract(epoch FROM min(t.available_at) - clock.now)::float8 AS next_due_in_s
    FROM {table} AS t, clock
    WHERE t.status = 'pending'
    GROUP BY clock.now
), in_flight AS (
    SELECT count(*) AS sending,
           count(*) FILTER (WHERE t.lease_expires_at < clock.now
                            OR t.updated_at < clock.now - make_interval(secs => %(stuck_after_s)s)) AS stuck,
           min(t.created_at) AS oldest_created,
           min(t.available_at) AS oldest_due_at
    FROM {table} AS t, clock
    WHERE t.status = 'sending'
), due_now AS (
    -- The lag check's sample: the oldest due first, each state through its own partial index, capped.
    (SELECT extract(epoch FROM (SELECT now FROM clock) - t.available_at)::float8 AS lag_s
     FROM {table} AS t
     WHERE t.status = 'pending' AND NOT t.ordering_blocked AND t.available_at <= (SELECT now FROM clock)
       AND t.topic <> ALL(%(paused_topics)s::text[])
     ORDER BY t.available_at LIMIT %(sample)s)
    UNION ALL
    (SELECT GREATEST(extract(epoch FROM (SELECT now FROM clock) - t.available_at)::float8, 0) AS lag_s
     FROM {table} AS t WHERE t.status = 'sending' ORDER BY t.lease_expires_at LIMIT %(sample)s)
), lag_now AS (
    SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY lag_s)::float8 AS p95 FROM due_now
), dead AS (
    SELECT coalesce(jsonb_object_agg(code, n), '{{}}'::jsonb) AS by_code, coalesce(sum(n), 0)::bigint AS total
    FROM (SELECT coalesce(t.last_error_code, 'UNKNOWN') AS code, count(*) AS n
          FROM {table} AS t WHERE t.status = 'dead' GROUP BY 1) AS d
), delivered AS (
    -- The window's bound is a scalar, so the index scan stops at it instead of walking every sent row.
    SELECT extract(epoch FROM t.published_at - t.created_at)::float8 AS lag_s
    FROM {table} AS t
    WHERE t.status = 'sent'
      AND t.published_at >= (SELECT now FROM clock) - make_interval(secs => %(window_s)s)
    ORDER BY t.published_at DESC
    LIMIT %(sample)s
), still_waiting AS (
    -- Each state through its own partial index, each capped: the oldest first.
    (SELECT extract(epoch FROM (SELECT now FROM clock) - t.created_at)::float8 AS lag_s
     FROM {table} AS t WHERE t.status = 'pending' AND NOT t.ordering_blocked ORDER BY t.id LIMIT %(sample)s)
    UNION ALL
    (SELECT extract(epoch FROM (SELECT now FROM clock) - t.created_at)::float8 AS lag_s
     FROM {table} AS t WHERE t.status = 'pending' AND t.ordering_blocked ORDER BY t.id LIMIT %(sample)s)
    UNION ALL
    (SELECT extract(epoch FROM (SELECT now FROM clock) - t.created_at)::float8 AS lag_s
     FROM {table} AS t WHERE t.status = 'sending' ORDER BY t.lease_expires_at LIMIT %(sample)s)
), lag AS (
    SELECT count(*) AS n,
           percentile_cont(0.50) WITHIN GROUP (ORDER BY lag_s)::float8 AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY lag_s)::float8 AS p95,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY lag_s)::float8 AS p99
    FROM (SELECT lag_s FROM delivered UNION ALL SELECT lag_s FROM still_waiting) AS s
), parked AS (
    -- Blocked keys: a key whose head is dead and parked (the "park" policy) holds its later messages
    -- back until the head is replayed or skipped. A parked head is its key's only dead message.
    SELECT t.ordering_key, t.id, t.updated_at AS died_at, t.last_error_code, left(t.last_error, 300) AS last_error
    FROM {table} AS t
    WHERE t.status = 'dead' AND t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL
), blocked AS (
    SELECT count(DISTINCT p.ordering_key) AS keys, min(p.died_at) AS since,
           (SELECT count(*) FROM {table} AS w JOIN (SELECT DISTINCT ordering_key FROM parked) AS k
              ON w.ordering_key = k.ordering_key
            WHERE w.status = 'pending' AND w.ordering_skipped_at IS NULL) AS messages,
           (SELECT coalesce(jsonb_agg(jsonb_build_object('key', x.ordering_key, 'id', x.id, 'died_at', x.died_at,
                                                         'error_code', x.last_error_code, 'error', x.last_error)
                                      ORDER BY x.died_at, x.id), '[]')
              FROM (SELECT * FROM parked ORDER BY died_at, id LIMIT 5) AS x) AS oldest
    FROM parked AS p
)
SELECT coalesce(w.pending, 0) AS pending, coalesce(w.retrying, 0) AS retrying, coalesce(w.ready, 0) AS ready,
       GREATEST(w.oldest_waiting_age_s,
                extract(epoch FROM (SELECT now FROM clock) - f.oldest_created)::float8) AS oldest_waiting_age_s,
       w.next_due_in_s, f.sending, f.stuck, d.by_code AS dead_by_code, d.total AS dead,
       lag.n AS lag_sample, lag.p50 AS lag_p50, lag.p95 AS lag_p95, lag.p99 AS lag_p99,
       coalesce(w.due, 0) + f.sending AS waiting_now,
       GREATEST(extract(epoch FROM (SELECT now FROM clock) - LEAST(w.oldest_due_at, f.oldest_due_at))::float8,
                0) AS lag_now_s,
       coalesce(lag_now.p95, 0) AS lag_now_p95_s,
       b.keys AS blocked_keys, b.since AS blocked_since, b.messages AS blocked_messages, b.oldest AS blocked_oldest,
       coalesce(w.paused, 0) AS paused_waiting, w.paused_oldest_s
FROM in_flight AS f CROSS JOIN dead AS d CROSS JOIN lag CROSS JOIN lag_now CROSS JOIN blocked AS b
     LEFT JOIN waiting AS w ON true

-- name: outbox_retry_destination_failures_now
-- The circuit closed: messages waiting out a backoff because the destination was
-- down are due again now, so delivery resumes at once instead of after the backoff.
WITH pulled AS (
    UPDATE {table} AS t
    SET available_at = coalesce(%(now)s::timestamptz, now()), updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE t.status = 'pending'
      AND t.available_at > coalesce(%(now)s::timestamptz, now())
      AND t.last_error_code = ANY(%(codes)s::text[])
    RETURNING t.id
), wake AS (
    SELECT pg_notify('outbox:' || %(table_name)s, '') WHERE EXISTS (SELECT 1 FROM pulled)
)
SELECT count(*) AS pulled FROM pulled LEFT JOIN wake ON true

-- name: outbox_skip_dead_heads
-- An operator passes over parked dead messages (by id, or every parked head of one key): they stay dead
-- and audited, and their keys' later messages go on. With dry_run nothing changes.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), matched AS (
    SELECT t.id, t.event_id, t.tenant_id, t.ordering_key, t.last_error_code, t.headers
    FROM {table} AS t
    WHERE t.status = 'dead' AND t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL
      AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND (%(ordering_key)s::text IS NULL OR t.ordering_key = %(ordering_key)s::text)
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t
), skipped AS (
    UPDATE {table} AS t
    SET ordering_skipped_at = clock.now, updated_at = clock.now
    FROM matched AS m, clock
    WHERE t.id = m.id AND NOT %(dry_run)s::boolean
    RETURNING t.id
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                              code, error_code, worker, trace_id, detail)
    SELECT %(table_name)s, m.id, m.event_id, m.tenant_id, 'dead', 'dead', 'outbox_skip', m.last_error_code,
           %(worker)s, m.headers->>'trace_id',
           left(format('skipped: the rest of key %%s goes on without it (%%s)', m.ordering_key, %(reason)s::text), 2000)
    FROM matched AS m JOIN skipped AS s ON s.id = m.id
), release AS (
    SELECT CASE WHEN r.keys IS NOT NULL THEN outbox_release_keys(%(table_name)s, r.keys, r.ids) END AS contended
    FROM (SELECT array_agg(m.ordering_key) AS keys, array_agg(m.id) AS ids
          FROM matched AS m JOIN skipped AS s ON s.id = m.id) AS r
), wake AS (
    SELECT pg_notify('outbox:' || %(table_name)s, '') WHERE EXISTS (SELECT 1 FROM skipped)
)
SELECT m.id, m.event_id, m.ordering_key, m.last_error_code, (s.id IS NOT NULL) AS skipped, r.contended
FROM matched AS m LEFT JOIN skipped AS s ON s.id = m.id LEFT JOIN release AS r ON true LEFT JOIN wake ON true
ORDER BY m.id

-- name: outbox_unblock_sweep
-- The backstop of ordering (migration 0010): a page of the keys that have blocked messages, from
-- after_key on, walked one key at a time through <t>_blocked_by_key; each key whose head is blocked
-- (its release was missed: a relay gone between a settle and its retry) is released. Returns the
-- page's last key (NULL: the walk reached the end) and the keys released.
WITH RECURSIVE walk AS (
    (SELECT t.ordering_key AS key, 1 AS n
     FROM {table} AS t
     WHERE t.status = 'pending' AND t.ordering_blocked AND t.ordering_key > %(after_key)s::text
     ORDER BY t.ordering_key LIMIT 1)
    UNION ALL
    SELECT (SELECT t.ordering_key FROM {table} AS t
            WHERE t.status = 'pending' AND t.ordering_blocked AND t.ordering_key > walk.key
            ORDER BY t.ordering_key LIMIT 1), walk.n + 1
    FROM walk
    WHERE walk.key IS NOT NULL AND walk.n < %(limit)s
), page AS (
    SELECT w.key FROM walk AS w WHERE w.key IS NOT NULL
), orphaned AS (
    SELECT p.key
    FROM page AS p
    CROSS JOIN LATERAL (SELECT h.ordering_blocked FROM {table} AS h
                        WHERE h.ordering_key = p.key AND h.ordering_skipped_at IS NULL
                          AND h.status IN ('pending', 'sending', 'dead')
                        ORDER BY h.id LIMIT 1) AS head
    WHERE head.ordering_blocked
), release AS (
    SELECT CASE WHEN r.keys IS NOT NULL THEN outbox_release_keys(%(table_name)s, r.keys, ARRAY[]::bigint[]) END
           AS contended
    FROM (SELECT array_agg(key) AS keys FROM orphaned) AS r
)
SELECT (SELECT CASE WHEN count(*) >= %(limit)s THEN max(key) END FROM page) AS last_key,
       coalesce((SELECT array_agg(key) FROM orphaned), ARRAY[]::text[]) AS released,
       (SELECT contended FROM release) AS contended

-- name: outbox_release_keys_again
-- Keys a settle could not release while a writer (or another relay's settle) was committing a message of theirs
-- (migration 0010). With fast_commit (the caller's autocommit session: this statement is its transaction) the
-- commit does not wait for the WAL flush: a release a crash loses leaves the key's next message waiting, for
-- the sweep (outbox_unblock_sweep) to let go; no message is lost or reordered. Waiting for the flush cost a
-- 4-relay keyed drain ~10 ms per batch (bench/keyed.py).
SELECT outbox_release_keys(%(table_name)s, %(keys)s::text[], ARRAY[]::bigint[]) AS contended,
       CASE WHEN %(fast_commit)s THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
