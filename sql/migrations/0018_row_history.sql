-- outbox: no transaction
-- Nothing moves without a trace, and no login can stall a commit (issue 42). On every outbox table:
--
--   * a change of a row's state (its status, its passing over, its attempts lowered, the row deleted) that the
--     statement making it does not audit itself is audited by the database, once per statement, with the login
--     that made it (outbox_audit.login, migration 0017): the engine's statements audit their changes row by row,
--     so they add nothing; an UPDATE by hand adds a row, whoever runs it, except the tables' owner (who can drop
--     the triggers, and is trusted with the schema);
--   * whether a new keyed message waits behind an earlier one of its key is the database's to say, whatever the
--     INSERT wrote: a producer reads no row's key or state, and sets no row's place in its key;
--   * the at-commit check of a waiting message (migration 0010) tries its key's lock and never waits for it: a
--     login needs no grant to take an advisory lock, and one that held them all held every keyed commit.
--
-- The functions first (each statement on its own: this file runs outside a transaction), then each outbox table
-- gets its at-commit function again and, when it lacks them, its triggers: one table and one statement at a time,
-- under the short lock timeout. Functions that read a table name it with the schema this migration runs in, and
-- run with a search_path of pg_catalog alone: a caller's objects of the same names are never theirs.

-- Before a statement that updates or deletes outbox rows: the audit's last id, so that the check after it reads
-- only the audit rows written since, by primary key. Kept for the rest of the transaction (the lowest mark is the
-- right one). A mark set by hand only makes that check read more rows, or audit again what was audited.
DO $do$
BEGIN
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION outbox_audit_mark() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
        BEGIN
            IF coalesce(current_setting('outbox.audit_mark', true), '') = '' THEN
                PERFORM set_config('outbox.audit_mark',
                                   coalesce((SELECT max(a.id) FROM %1$I.outbox_audit AS a), 0)::text, true);
            END IF;
            RETURN NULL;
        END
        $body$ $fn$, current_schema());
END
$do$;

-- After a statement that updated or deleted outbox rows: the changes it made that no audit row of its transaction
-- tells are audited, one row per kind of change (a status to another, passed over, attempts lowered, deleted),
-- naming the message when it is one, with the login (the column's default) and no worker (nobody said). An audit
-- row tells a change when this transaction wrote it since the mark, for the same table and message, to the row's
-- new status (for a change of status) or at all (passed over, attempts lowered); a deleted row is told by its own
-- row ("deleted") or by a clean-up's summary of the rows of its status that went ("gone"). The engine's statements
-- audit what they change, so after them this writes nothing; an audit row written by hand to cover a change names
-- its login too. The audit is read by primary key between the mark and its last id now: a range the cached plan
-- walks by index, whatever the audit holds (a bound on one side only was planned as a third of the table).
DO $do$
BEGIN
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION outbox_record_changes() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
        DECLARE
            mark bigint;
            top bigint;
            untold bigint[];
        BEGIN
            IF pg_has_role(session_user, (SELECT c.relowner FROM pg_class AS c WHERE c.oid = TG_RELID), 'MEMBER') THEN
                RETURN NULL;  -- the tables' owner, or a superuser: it may switch this trigger off anyway
            END IF;
            mark := coalesce(nullif(current_setting('outbox.audit_mark', true), '')::bigint, 0);
            top := (SELECT max(a.id) FROM %1$I.outbox_audit AS a);
            IF TG_OP = 'UPDATE' THEN
                untold := ARRAY(
                    SELECT n.id FROM old_rows AS o JOIN new_rows AS n ON n.id = o.id
                     WHERE (o.status IS DISTINCT FROM n.status
                            OR (o.ordering_skipped_at IS NULL AND n.ordering_skipped_at IS NOT NULL)
                            OR n.attempts < o.attempts)
                       AND NOT EXISTS (SELECT 1 FROM %1$I.outbox_audit AS a
                                       WHERE a.id > mark AND a.id <= top AND a.xact = pg_current_xact_id()
                                         AND a.outbox_table = TG_TABLE_NAME AND a.message_id = n.id
                                         AND (a.to_status = n.status OR o.status IS NOT DISTINCT FROM n.status)));
                IF cardinality(untold) = 0 THEN
                    RETURN NULL;  -- the statement audited all it changed: the engine's always do
                END IF;
                INSERT INTO %1$I.outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                                               attempts, code, detail)
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
                  FROM (SELECT n.id, n.event_id, n.tenant_id, o.status AS was, n.status AS became, n.attempts,
                               CASE WHEN o.status IS DISTINCT FROM n.status THEN 'status'
                                    WHEN o.ordering_skipped_at IS NULL AND n.ordering_skipped_at IS NOT NULL
                                    THEN 'passed over'
                                    ELSE 'attempts lowered' END AS kind
                          FROM old_rows AS o JOIN new_rows AS n ON n.id = o.id
                         WHERE n.id = ANY(untold)) AS c
                 GROUP BY c.was, c.became, c.kind;
            ELSE
                untold := ARRAY(
                    SELECT o.id FROM old_rows AS o
                     WHERE NOT EXISTS (SELECT 1 FROM %1$I.outbox_audit AS a
                                       WHERE a.id > mark AND a.id <= top AND a.xact = pg_current_xact_id()
                                         AND a.outbox_table = TG_TABLE_NAME AND a.message_id = o.id
                                         AND a.to_status = 'deleted')
                       AND NOT EXISTS (SELECT 1 FROM %1$I.outbox_audit AS a
                                       WHERE a.id > mark AND a.id <= top AND a.xact = pg_current_xact_id()
                                         AND a.outbox_table = TG_TABLE_NAME AND a.message_id IS NULL
                                         AND a.to_status = 'gone' AND a.from_status = o.status));
                IF cardinality(untold) = 0 THEN
                    RETURN NULL;
                END IF;
                INSERT INTO %1$I.outbox_audit (outbox_table, message_id, event_id, tenant_id, from_status, to_status,
                                               attempts, code, detail)
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
                  FROM old_rows AS c
                 WHERE c.id = ANY(untold)
                 GROUP BY c.status;
            END IF;
            RETURN NULL;
        END
        $body$ $fn$, current_schema());
END
$do$;

-- A new keyed message waits (ordering_blocked) when an earlier message of its key still holds the key, whatever the
-- INSERT wrote; an unkeyed one never waits. Rows of the same statement inserted before it count (a batch's second
-- message of a key waits behind its first). Run as the owner: the writer may read no row's key or state.
CREATE OR REPLACE FUNCTION outbox_create_insert_check(table_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format($def$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
        BEGIN
            NEW.ordering_blocked := NEW.ordering_key IS NOT NULL
                AND EXISTS (SELECT 1 FROM %2$I.%3$I AS p
                            WHERE p.ordering_key = NEW.ordering_key AND p.ordering_skipped_at IS NULL
                              AND p.status IN ('pending', 'sending', 'dead'));
            RETURN NEW;
        END
        $body$ $def$, outbox_ordering_function('waits', table_name), current_schema(), table_name);
END
$fn$;

-- The at-commit check of a message that waited when it was inserted (migration 0010's, but never waiting): with
-- the key's lock, it is exact, as before. Without it (someone holds the key's stripe: a settle releasing a key of
-- that stripe this very moment, or a login that took it to hold writers up), the commit goes on: the message is
-- let go if nothing of its key before it still holds the key, as the lock would have allowed; otherwise it waits,
-- and the key's release, or the sweep (outbox_unblock_sweep) when that release missed it, lets it go.
CREATE OR REPLACE FUNCTION outbox_create_at_commit(table_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format($def$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan AS $body$
        BEGIN
            PERFORM pg_try_advisory_xact_lock_shared(%4$s, hashtext(NEW.ordering_key) & 511);
            IF NOT EXISTS (SELECT 1 FROM %2$I.%3$I AS p
                           WHERE p.ordering_key = NEW.ordering_key AND p.id < NEW.id
                             AND p.ordering_skipped_at IS NULL AND p.status IN ('pending', 'sending', 'dead')) THEN
                UPDATE %2$I.%3$I SET ordering_blocked = false
                 WHERE id = NEW.id AND status = 'pending' AND ordering_blocked;
            END IF;
            RETURN NULL;
        END
        $body$ $def$, outbox_ordering_function('at_commit', table_name), current_schema(), table_name,
        outbox_ordering_lock_space(table_name));
END
$fn$;

-- A table's guards: the insert check, and the audit of the changes no statement audited (statement triggers: a
-- statement's rows are read once, after it, from its transition tables). CREATE OR REPLACE TRIGGER: a rerun
-- changes nothing.
CREATE OR REPLACE FUNCTION outbox_create_guards(table_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM outbox_create_insert_check(table_name);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I BEFORE INSERT ON %I FOR EACH ROW '
                   'WHEN (NEW.ordering_key IS NOT NULL OR NEW.ordering_blocked) EXECUTE FUNCTION %I()',
                   'outbox_ordering_on_insert', table_name, outbox_ordering_function('waits', table_name));
    EXECUTE format('CREATE OR REPLACE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH STATEMENT '
                   'EXECUTE FUNCTION outbox_audit_mark()', 'outbox_audit_mark', table_name);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER UPDATE ON %I REFERENCING OLD TABLE AS old_rows '
                   'NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox_record_changes()',
                   'outbox_audit_updates', table_name);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER DELETE ON %I REFERENCING OLD TABLE AS old_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION outbox_record_changes()', 'outbox_audit_deletes', table_name);
END
$fn$;

-- 0010's, with the at-commit function of outbox_create_at_commit and the guards: what a table made from now on gets.
CREATE OR REPLACE FUNCTION outbox_create_ordering(table_name text)
RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS ordering_key text, '
                   'ADD COLUMN IF NOT EXISTS ordering_blocked boolean NOT NULL DEFAULT false, '
                   'ADD COLUMN IF NOT EXISTS ordering_skipped_at timestamptz', table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (id) WHERE status = ''pending'' AND NOT ordering_blocked',
                   outbox_index_name(table_name, 'ready_by_id'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key, id) '
                   'WHERE status = ''pending'' AND ordering_blocked',
                   outbox_index_name(table_name, 'blocked_by_key'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key, id) WHERE ordering_key IS NOT NULL '
                   'AND ordering_skipped_at IS NULL AND status IN (''pending'', ''sending'', ''dead'')',
                   outbox_index_name(table_name, 'by_ordering_key'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key) WHERE status = ''sending'' '
                   'AND ordering_key IS NOT NULL', outbox_index_name(table_name, 'sending_by_key'), table_name);
    EXECUTE format($def$
        CREATE OR REPLACE FUNCTION %1$I(keys text[], released bigint[]) RETURNS void
        LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $body$
        BEGIN
            UPDATE %2$I.%3$I AS t SET ordering_blocked = false
              FROM unnest(keys) AS k(key)
              CROSS JOIN LATERAL (
                  SELECT h.id, h.status, h.ordering_blocked FROM %2$I.%3$I AS h
                  WHERE h.ordering_key = k.key AND h.ordering_skipped_at IS NULL
                    AND h.status IN ('pending', 'sending', 'dead') AND h.id <> ALL(released)
                  ORDER BY h.id LIMIT 1) AS head
             WHERE t.id = head.id AND head.status = 'pending' AND head.ordering_blocked
               AND t.status = 'pending' AND t.ordering_blocked;
        END
        $body$ $def$, outbox_ordering_function('release', table_name), current_schema(), table_name);
    PERFORM outbox_create_at_commit(table_name);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_ordering_at_commit', table_name);
    EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER INSERT ON %I DEFERRABLE INITIALLY DEFERRED '
                   'FOR EACH ROW WHEN (NEW.ordering_blocked) EXECUTE FUNCTION %I()',
                   'outbox_ordering_at_commit', table_name, outbox_ordering_function('at_commit', table_name));
    PERFORM outbox_create_guards(table_name);
END
$fn$;

-- The sessions holding a table's ordering locks (outbox_ordering_lock_space's, two-key advisory locks), for
-- `status` and the blocked-keys check: pid, application name, login, how many stripes and whether exclusively,
-- since when at the latest (the transaction's start; for a session outside any transaction, the end of its last
-- statement: NULL where the owner may not read other sessions' activity), and whether it holds them outside any
-- transaction (a session lock: the engine never takes one). Never what the session runs. SECURITY DEFINER: the
-- times are the owner's to read (pg_read_all_stats), and every login may see who holds writers' locks.
CREATE OR REPLACE FUNCTION outbox_ordering_lock_holders(table_name text)
RETURNS TABLE (pid integer, application_name text, login text, stripes integer, exclusive boolean,
               held_since timestamptz, outside_transaction boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT l.pid, a.application_name::text, a.usename::text, count(*)::integer, bool_or(l.mode = 'ExclusiveLock'),
           coalesce(a.xact_start, a.state_change), bool_and(split_part(l.virtualtransaction, '/', 2) = '0')
    FROM pg_locks AS l
    LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
      AND l.classid = (hashtext('outbox_ordering:' || table_name)::bigint & 4294967295)::oid
      AND l.pid <> pg_backend_pid()
    GROUP BY l.pid, a.application_name, a.usename, a.xact_start, a.state_change
    ORDER BY l.pid
$fn$;

-- outbox: run each statement this query returns
WITH outbox_table AS (
    SELECT c.relname::text AS name
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()
      AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
)
SELECT format('SELECT outbox_create_at_commit(%L)', name)
FROM outbox_table
WHERE EXISTS (SELECT 1 FROM pg_trigger AS tg
              WHERE tg.tgrelid = to_regclass(quote_ident(name)) AND tg.tgname = 'outbox_ordering_at_commit')
ORDER BY name;

-- outbox: run each statement this query returns
WITH outbox_table AS (
    SELECT c.relname::text AS name
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()
      AND EXISTS (SELECT 1 FROM pg_trigger AS tg WHERE tg.tgrelid = c.oid AND tg.tgname = 'outbox_notify_insert')
)
SELECT format('SELECT outbox_create_guards(%L)', name)
FROM outbox_table
WHERE (SELECT count(*) FROM pg_trigger AS tg
       WHERE tg.tgrelid = to_regclass(quote_ident(name))
         AND tg.tgname IN ('outbox_ordering_on_insert', 'outbox_audit_mark', 'outbox_audit_updates',
                           'outbox_audit_deletes')) < 4
ORDER BY name;
