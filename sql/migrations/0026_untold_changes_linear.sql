-- The check after an UPDATE or DELETE of outbox rows (0018's outbox_record_changes) reads each statement's rows once.
--
-- It runs after every such statement of a login that does not own the tables: the relay's, the requeue's and the
-- cleaner's, as a least-privilege deployment runs them. It could keep, for the rest of its session, a plan made
-- while a statement changed a row or none: a nested loop that paired every old row with every new row, then every
-- changed row with every audit row its transaction had written. A settle of 100 messages compared 15,000 pairs
-- (5.5 ms of a 9.6 ms settle); a hand UPDATE of 4,000 rows took 176 s. Now set differences first find whether every
-- row whose state moved has an audit row to its new status (the engine's statements write one for each row they
-- change, and a key's release moves no state): then nothing is untold. Otherwise the rows are grouped by id (old,
-- new, and the audit rows of the transaction together) and the untold changes written by the same statement;
-- neither can be planned row against row. What is audited is unchanged: the same rows, in the same form, with the
-- login. Only the function is replaced: no table is locked, and no row is read.
DO $do$
BEGIN
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION outbox_record_changes() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
        DECLARE
            mark bigint;
            top bigint;
        BEGIN
            IF pg_has_role(session_user, (SELECT c.relowner FROM pg_class AS c WHERE c.oid = TG_RELID), 'MEMBER') THEN
                RETURN NULL;  -- the tables' owner, or a superuser: it may switch this trigger off anyway
            END IF;
            mark := coalesce(nullif(current_setting('outbox.audit_mark', true), '')::bigint, 0);
            top := (SELECT max(a.id) FROM %1$I.outbox_audit AS a);
            IF TG_OP = 'UPDATE' THEN
                -- Nothing is untold when every row whose status, attempts or passing over moved has an audit row to
                -- its new status: the engine's statements write one for each row they change, and a key's release
                -- moves none of them. Found by set differences, which no plan pairs row by row.
                PERFORM 1
                   FROM (SELECT moved.id, moved.status
                           FROM (SELECT n.id, n.status, n.attempts, n.ordering_skipped_at IS NULL FROM new_rows AS n
                                 EXCEPT
                                 SELECT o.id, o.status, o.attempts, o.ordering_skipped_at IS NULL FROM old_rows AS o)
                                AS moved
                         EXCEPT
                         SELECT a.message_id, a.to_status
                           FROM %1$I.outbox_audit AS a
                          WHERE a.id > mark AND a.id <= top AND a.xact = pg_current_xact_id()
                            AND a.outbox_table = TG_TABLE_NAME) AS maybe_untold
                  LIMIT 1;
                IF NOT FOUND THEN
                    RETURN NULL;
                END IF;
                -- src 0: the row before, 1: after, 2: an audit row of this transaction since the mark naming it.
                INSERT INTO %1$I.outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                                               attempts, code, detail)
                WITH r AS (
                    SELECT 0 AS src, o.id, o.status, o.event_id, o.tenant_id, o.attempts, o.ordering_skipped_at
                      FROM old_rows AS o
                    UNION ALL
                    SELECT 1, n.id, n.status, n.event_id, n.tenant_id, n.attempts, n.ordering_skipped_at
                      FROM new_rows AS n
                    UNION ALL
                    SELECT 2, a.message_id, a.to_status, NULL, NULL, NULL, NULL
                      FROM %1$I.outbox_audit AS a
                     WHERE a.id > mark AND a.id <= top AND a.xact = pg_current_xact_id()
                       AND a.outbox_table = TG_TABLE_NAME AND a.message_id IS NOT NULL
                ), row_changes AS (
                    SELECT r.id,
                           max(r.status) FILTER (WHERE r.src = 0) AS was,
                           max(r.status) FILTER (WHERE r.src = 1) AS became,
                           max(r.event_id) FILTER (WHERE r.src = 1) AS event_id,
                           max(r.tenant_id) FILTER (WHERE r.src = 1) AS tenant_id,
                           max(r.attempts) FILTER (WHERE r.src = 0) AS attempts_was,
                           max(r.attempts) FILTER (WHERE r.src = 1) AS attempts,
                           bool_or(r.src = 0 AND r.ordering_skipped_at IS NULL)
                               AND bool_or(r.src = 1 AND r.ordering_skipped_at IS NOT NULL) AS passed_over,
                           bool_or(r.src = 0) AND bool_or(r.src = 1) AS updated,
                           array_agg(r.status) FILTER (WHERE r.src = 2) AS told
                      FROM r
                     GROUP BY r.id
                ), c AS (
                    -- A change of status is told by an audit row to the new status; another change, by any.
                    SELECT x.*, CASE WHEN x.was IS DISTINCT FROM x.became THEN 'status'
                                     WHEN x.passed_over THEN 'passed over'
                                     ELSE 'attempts lowered' END AS kind
                      FROM row_changes AS x
                     WHERE x.updated
                       AND (x.was IS DISTINCT FROM x.became OR x.passed_over OR x.attempts < x.attempts_was)
                       AND NOT CASE WHEN x.was IS DISTINCT FROM x.became THEN x.became = ANY(coalesce(x.told, '{}'))
                                    ELSE x.told IS NOT NULL END
                )
                SELECT TG_TABLE_NAME, CASE WHEN count(*) = 1 THEN min(c.id) END,
                       CASE WHEN count(*) = 1 THEN min(c.event_id) END,
                       CASE WHEN count(*) = 1 THEN min(c.tenant_id) END,
                       c.was, c.became, CASE WHEN count(*) = 1 THEN min(c.attempts) END, 'outbox_untold_change',
                       format('%%s: %%s (%%s)', c.kind,
                              CASE WHEN count(*) = 1 THEN '1 row that no audit row of its statement tells'
                                   ELSE count(*) || ' rows that no audit row of their statement tells' END,
                              CASE WHEN count(*) = 1 THEN 'id ' || min(c.id)
                                   WHEN count(*) <= 20 THEN 'ids ' || string_agg(c.id::text, ', ' ORDER BY c.id)
                                   ELSE format('ids %%s..%%s', min(c.id), max(c.id)) END)
                  FROM c
                 GROUP BY c.was, c.became, c.kind;
            ELSE
                -- A deleted row is told by its own audit row ("deleted") or by a clean-up's summary of its status.
                INSERT INTO %1$I.outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                                               attempts, code, detail)
                WITH told AS (
                    SELECT a.message_id, a.from_status, a.to_status
                      FROM %1$I.outbox_audit AS a
                     WHERE a.id > mark AND a.id <= top AND a.xact = pg_current_xact_id()
                       AND a.outbox_table = TG_TABLE_NAME AND a.to_status IN ('deleted', 'gone')
                ), r AS (
                    SELECT 0 AS src, o.id, o.status, o.event_id, o.tenant_id, o.attempts FROM old_rows AS o
                    UNION ALL
                    SELECT 2, t.message_id, NULL, NULL, NULL, NULL FROM told AS t
                     WHERE t.message_id IS NOT NULL AND t.to_status = 'deleted'
                ), c AS (
                    SELECT r.id, max(r.status) FILTER (WHERE r.src = 0) AS status,
                           max(r.event_id) FILTER (WHERE r.src = 0) AS event_id,
                           max(r.tenant_id) FILTER (WHERE r.src = 0) AS tenant_id,
                           max(r.attempts) FILTER (WHERE r.src = 0) AS attempts
                      FROM r
                     GROUP BY r.id
                    HAVING bool_or(r.src = 0) AND NOT bool_or(r.src = 2)
                )
                SELECT TG_TABLE_NAME, CASE WHEN count(*) = 1 THEN min(c.id) END,
                       CASE WHEN count(*) = 1 THEN min(c.event_id) END,
                       CASE WHEN count(*) = 1 THEN min(c.tenant_id) END,
                       c.status, 'deleted', CASE WHEN count(*) = 1 THEN min(c.attempts) END, 'outbox_untold_change',
                       format('deleted: %%s (%%s)',
                              CASE WHEN count(*) = 1 THEN '1 row that no audit row of its statement tells'
                                   ELSE count(*) || ' rows that no audit row of their statement tells' END,
                              CASE WHEN count(*) = 1 THEN 'id ' || min(c.id)
                                   WHEN count(*) <= 20 THEN 'ids ' || string_agg(c.id::text, ', ' ORDER BY c.id)
                                   ELSE format('ids %%s..%%s', min(c.id), max(c.id)) END)
                  FROM c
                 WHERE NOT EXISTS (SELECT 1 FROM told AS t
                                    WHERE t.message_id IS NULL AND t.to_status = 'gone' AND t.from_status = c.status)
                 GROUP BY c.status;
            END IF;
            RETURN NULL;
        END
        $body$ $fn$, current_schema());
END
$do$;
