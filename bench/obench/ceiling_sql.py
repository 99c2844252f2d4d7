"""The hand-written ceiling's SQL: the claim and settle statements, copied by hand.

These are copies of ``outbox_claim`` and ``outbox_settle`` from
sql/queries/outbox.sql, so the ceiling does exactly the same database work as
the core (SKIP LOCKED claim + attempts + lease + audit CTE; batched settle from
unnest + audit CTE) without any of the core's Python around it. They are
copies rather than imports on purpose: the ceiling must not move when the core
changes. ``drift()`` says whether the core's text still matches, and the report
records it, so a ratio is never silently computed against different SQL.
"""

import re

from psycopg import sql

CLAIM = """
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), ready AS (
    SELECT t.id
    FROM {table} AS t, clock
    WHERE t.status = 'pending'
      AND t.available_at <= clock.now
      AND t.topic <> ALL(%(paused_topics)s::text[])
    ORDER BY t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE {table} AS t
    SET status = 'sending',
        attempts = t.attempts + 1,
        locked_by = %(worker)s,
        locked_at = clock.now,
        lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        updated_at = clock.now
    FROM ready, clock
    WHERE t.id = ready.id
    RETURNING t.id, t.event_id, t.tenant_id, t.topic, t.payload, t.payload_sha, t.headers,
              t.attempts, t.created_at
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, from_status, to_status,
                              attempts, code, worker, trace_id)
    SELECT %(table_name)s, c.id, c.event_id, 'pending', 'sending', c.attempts, 'outbox_claim',
           %(worker)s, c.headers->>'trace_id'
    FROM claimed AS c
)
SELECT * FROM claimed ORDER BY id
"""

SETTLE = """
-- One statement settles a whole batch: sent / retry / dead rows are updated,
-- rows whose table deletes on success are deleted, and every row that is no
-- longer held by this worker at this attempt is audited as a conflict.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), input AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
                %(delays)s::float8[], %(error_codes)s::text[], %(errors)s::text[],
                %(refs)s::text[], %(audit_codes)s::text[])
         AS i(id, attempts, status, delay_s, error_code, error, ref, audit_code)
), updated AS (
    UPDATE {table} AS t
    SET status = i.status,
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
        updated_at = clock.now
    FROM input AS i, clock
    WHERE t.id = i.id
      AND t.status = 'sending'
      AND t.locked_by = %(worker)s
      AND t.attempts = i.attempts
    RETURNING t.id, t.event_id, t.attempts, t.headers, i.status, i.error_code, i.audit_code
), deleted AS (
    -- Deletions come in arrays of their own (empty unless the table deletes on success), so
    -- neither part of the statement scans the other's rows.
    DELETE FROM {table} AS t
    USING unnest(%(delete_ids)s::bigint[], %(delete_attempts)s::int[], %(delete_audit_codes)s::text[],
                 %(delete_error_codes)s::text[]) AS d(id, attempts, audit_code, error_code)
    WHERE t.id = d.id
      AND t.status = 'sending'
      AND t.locked_by = %(worker)s
      AND t.attempts = d.attempts
    RETURNING t.id, t.event_id, t.attempts, t.headers, 'deleted'::text AS status, d.error_code, d.audit_code
), all_input AS (
    SELECT id, attempts, status, error_code FROM input
    UNION ALL
    SELECT id, attempts, 'deleted', error_code
    FROM unnest(%(delete_ids)s::bigint[], %(delete_attempts)s::int[], %(delete_error_codes)s::text[])
         AS d(id, attempts, error_code)
), settled AS (
    SELECT * FROM updated UNION ALL SELECT * FROM deleted
), audit AS (
    INSERT INTO outbox_audit (outbox_table, message_id, event_id, from_status, to_status,
                              attempts, code, error_code, worker, trace_id, detail)
    SELECT %(table_name)s, s.id, s.event_id, 'sending', s.status, s.attempts, s.audit_code,
           s.error_code, %(worker)s, s.headers->>'trace_id', NULL
    FROM settled AS s
    UNION ALL
    SELECT %(table_name)s, i.id, cur.event_id, cur.status, i.status, i.attempts,
           'outbox_flush_conflict', i.error_code, %(worker)s, cur.headers->>'trace_id',
           CASE WHEN cur.id IS NULL THEN 'row no longer exists'
                ELSE format('lease lost: row is %%s, held by %%s at attempt %%s',
                            cur.status, coalesce(cur.locked_by, 'nobody'), cur.attempts) END
    FROM all_input AS i
    LEFT JOIN {table} AS cur ON cur.id = i.id
    WHERE i.id NOT IN (SELECT id FROM settled)
)
SELECT id FROM settled
"""

# The plain outbox INSERT of the enqueue ceiling: what an application would
# write by hand, with payload text and digest computed beforehand.
# The relay's session setting (core/relay.py RELAY_SESSION_OPTIONS): custom plans for the batched
# statements. The ceiling runs the same SQL under the same setting.
SESSION_OPTIONS = "-c plan_cache_mode=force_custom_plan"

PLAIN_INSERT = """
INSERT INTO {table} (event_id, topic, payload, payload_sha, headers)
VALUES (%s, %s, %s::jsonb, %s, %s::jsonb)
"""


def bind(text: str, table: str) -> bytes:
    """The statement with the quoted table name filled in, as bytes psycopg sends as-is.

    Bytes (not a Composed) so the ceiling pays no per-call composition cost;
    psycopg still prepares it server-side after a few executions, as it does
    for the core's statements.
    """
    return sql.SQL(text.strip()).format(table=sql.Identifier(table)).as_string().encode()


def _normalise(text: str) -> str:
    without_comments = "\n".join(line for line in text.splitlines() if not line.strip().startswith("--"))
    return re.sub(r"\s+", " ", without_comments).strip()


def drift() -> dict[str, bool]:
    """Whether the core's claim and settle SQL still equal the ceiling's copies."""
    from outbox_pipelines.core.queries import named_queries

    queries = named_queries()
    return {
        "outbox_claim": _normalise(queries.get("outbox_claim", "")) == _normalise(CLAIM),
        "outbox_settle": _normalise(queries.get("outbox_settle", "")) == _normalise(SETTLE),
    }
