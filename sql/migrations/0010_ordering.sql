-- Ordered delivery per key (issue 24): messages of one table sharing an ordering_key are delivered one
-- at a time, in id order; a key's next message is claimed only once the one before it is settled.
--
-- ordering_key         the aggregate whose messages must arrive in order (NULL: no order)
-- ordering_blocked     a keyed pending row behind an earlier message of its key: the claim never reads
--                      it (it is not in <t>_ready_by_id). Set at enqueue when the key holds a message;
--                      cleared when its key's message before it is delivered, or (dead) passed over.
-- ordering_skipped_at  a message passed over: a dead message under the table's "skip" policy, or one an
--                      operator skipped. It no longer holds its key (and, replayed, goes out unordered).
--
-- A message "holds" its key while it is pending, sending or dead and not passed over: the key's head is
-- its first such message. What keeps a key flowing, whichever order things happen in:
--   * the settle that releases a key (delivered, deleted, or dead and passed over) clears the flag of
--     the key's next message, in outbox_release_keys;
--   * a writer whose message was flagged re-checks at its commit (outbox_ordering_at_commit): the
--     message before it may have been released after the INSERT saw it and before the commit;
--   * the two take the key's advisory lock (the writer shared, the settle with a try, never waiting), so
--     one of them always sees the other: a settle that cannot take it hands the key back to its relay,
--     which releases it again once the writer committed; a sweep (outbox_unblock_sweep) is the backstop.
--
-- Indexes: <t>_ready_by_id (the claim's: pending rows not blocked; <t>_pending_by_id, the previous version's
-- claim, stays until `db upgrade --contract`, sql/contract/0001),
-- <t>_blocked_by_key (blocked rows, for the sweep and the checks), <t>_by_ordering_key (the messages
-- holding a key, a key's head first), <t>_sending_by_key (keys with a message in flight).

-- The first half of a key's advisory lock (the second is its stripe, outbox_ordering_stripe): two int4
-- keys, a space apart from the single-active lock's one bigint key.
CREATE OR REPLACE FUNCTION outbox_ordering_lock_space(table_name text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext('outbox_ordering:' || table_name) $$;

-- Keys share 512 lock stripes per table: a transaction that writes messages of 100,000 waiting keys
-- takes at most 512 locks at its commit (one per key ran out of the server's lock table, sized by
-- max_locks_per_transaction). Two keys of one stripe only make a settle release again a moment later.
CREATE OR REPLACE FUNCTION outbox_ordering_stripe(ordering_key text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext(ordering_key) & 511 $$;

-- The name of one of a table's own ordering functions (kind: release, at_commit; made by
-- outbox_create_ordering): a digest of the table's name, so that any name (up to 63 characters) fits.
CREATE OR REPLACE FUNCTION outbox_ordering_function(kind text, table_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'outbox_' || kind || '_' || left(md5(table_name), 16) $$;

-- Clears the flag of the next message of each released key, when it is blocked. Each statement here
-- reads a fresh snapshot (a volatile function under READ COMMITTED), taken after the key's lock: a
-- writer that committed a message of the key meanwhile is seen. Keys whose lock a committing writer
-- holds are returned: the caller releases them again (the lock is a try: a settle never waits on an
-- application's transaction). ``released``: the rows this statement just released, never a key's head.
CREATE OR REPLACE FUNCTION outbox_release_keys(table_name text, keys text[], released bigint[])
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked text[];
    contended text[];
BEGIN
    IF keys IS NULL OR cardinality(keys) = 0 THEN
        RETURN ARRAY[]::text[];
    END IF;
    SELECT coalesce(array_agg(k) FILTER (WHERE got), ARRAY[]::text[]),
           coalesce(array_agg(k) FILTER (WHERE NOT got), ARRAY[]::text[])
      INTO locked, contended
      FROM (SELECT k, pg_try_advisory_xact_lock(outbox_ordering_lock_space(table_name), outbox_ordering_stripe(k)) AS got
              FROM (SELECT DISTINCT k FROM unnest(keys) AS k WHERE k IS NOT NULL ORDER BY k) AS d) AS l;
    IF cardinality(locked) > 0 THEN
        -- The table's own release function (outbox_create_ordering): static SQL, planned once a session.
        EXECUTE format('SELECT %I($1, $2)', outbox_ordering_function('release', table_name))
            USING locked, coalesce(released, ARRAY[]::bigint[]);
    END IF;
    RETURN contended;
END
$$;

CREATE OR REPLACE FUNCTION outbox_create_ordering(table_name text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS ordering_key text, '
                   'ADD COLUMN IF NOT EXISTS ordering_blocked boolean NOT NULL DEFAULT false, '
                   'ADD COLUMN IF NOT EXISTS ordering_skipped_at timestamptz', table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (id) WHERE status = ''pending'' AND NOT ordering_blocked',
                   outbox_index_name(table_name, 'ready_by_id'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key, id) WHERE status = ''pending'' AND ordering_blocked',
                   outbox_index_name(table_name, 'blocked_by_key'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key, id) WHERE ordering_key IS NOT NULL '
                   'AND ordering_skipped_at IS NULL AND status IN (''pending'', ''sending'', ''dead'')',
                   outbox_index_name(table_name, 'by_ordering_key'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (ordering_key) WHERE status = ''sending'' '
                   'AND ordering_key IS NOT NULL', outbox_index_name(table_name, 'sending_by_key'), table_name);
    -- The release (outbox_release_keys, with the keys' locks held): the next message of each key, when it
    -- waits and nothing but the rows just ``released`` was before it, may go. Its own function, so
    -- that its plan is made once per session: planned on every settle it cost ~0.3 ms of each one.
    EXECUTE format($fn$
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
        $body$ $fn$, outbox_ordering_function('release', table_name), current_schema(), table_name);
    -- At the commit of a transaction that wrote a blocked message: if nothing of its key before it still
    -- holds the key (released since the INSERT looked), it is the key's head and may go. SECURITY
    -- DEFINER: the writer (an application's producer role) may insert a message but not change one; this
    -- function only clears its own new row's flag, and its search_path names no writable schema. The
    -- lock is outbox_ordering_lock_space's and outbox_ordering_stripe's, spelled out for that search_path.
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION %1$I() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan AS $body$
        BEGIN
            PERFORM pg_advisory_xact_lock_shared(%4$s, hashtext(NEW.ordering_key) & 511);
            IF NOT EXISTS (SELECT 1 FROM %2$I.%3$I AS p
                           WHERE p.ordering_key = NEW.ordering_key AND p.id < NEW.id
                             AND p.ordering_skipped_at IS NULL AND p.status IN ('pending', 'sending', 'dead')) THEN
                UPDATE %2$I.%3$I SET ordering_blocked = false
                 WHERE id = NEW.id AND status = 'pending' AND ordering_blocked;
            END IF;
            RETURN NULL;
        END
        $body$ $fn$, outbox_ordering_function('at_commit', table_name), current_schema(), table_name,
        outbox_ordering_lock_space(table_name));
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_ordering_at_commit', table_name);
    EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER INSERT ON %I DEFERRABLE INITIALLY DEFERRED '
                   'FOR EACH ROW WHEN (NEW.ordering_blocked) EXECUTE FUNCTION %I()',
                   'outbox_ordering_at_commit', table_name, outbox_ordering_function('at_commit', table_name));
END
$$;

CREATE OR REPLACE FUNCTION outbox_create_table(table_name text, with_dedup_index boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF table_name !~ '^[a-z_][a-z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'invalid outbox table name %: use lowercase letters, digits and _ (max 63, not starting with a digit)', quote_literal(table_name)
            USING ERRCODE = 'invalid_name';
    END IF;
    EXECUTE format($ddl$
        CREATE TABLE IF NOT EXISTS %I (
            id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            event_id         text        NOT NULL,
            tenant_id        text,
            topic            text        NOT NULL,
            payload          jsonb       NOT NULL,
            payload_sha      text        NOT NULL,
            headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
            status           text        NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'sending', 'sent', 'dead')),
            attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            available_at     timestamptz NOT NULL DEFAULT now(),
            locked_by        text,
            locked_at        timestamptz,
            lease_expires_at timestamptz,
            last_error       text        CHECK (length(last_error) <= 2000),
            last_error_code  text,
            result_ref       text,
            created_at       timestamptz NOT NULL DEFAULT now(),
            updated_at       timestamptz NOT NULL DEFAULT now(),
            published_at     timestamptz,
            CONSTRAINT %I UNIQUE (event_id)
        )$ddl$, table_name, outbox_index_name(table_name, 'event_id_key'));
    -- Counts, the next due row, the oldest waiting message: every pending row, by when it is due.
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (available_at, id) WHERE status = ''pending''',
                   outbox_index_name(table_name, 'pending_by_available'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (lease_expires_at) WHERE status = ''sending''',
                   outbox_index_name(table_name, 'sending_by_lease'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (published_at, id) WHERE status = ''sent''',
                   outbox_index_name(table_name, 'sent_by_published'), table_name);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (last_error_code, id) WHERE status = ''dead''',
                   outbox_index_name(table_name, 'dead_by_code'), table_name);
    -- Seed 004 §7: per-tenant questions (what did tenant X publish when) without a scan.
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (tenant_id, published_at, id) WHERE tenant_id IS NOT NULL',
                   outbox_index_name(table_name, 'by_tenant'), table_name);
    IF with_dedup_index THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (topic, payload_sha) WHERE status = ''sent''',
                       outbox_index_name(table_name, 'sent_by_payload'), table_name);
    END IF;
    -- Claim order (ready rows by id, a key's later messages left out) and ordering per key.
    PERFORM outbox_create_ordering(table_name);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', 'outbox_notify_insert', table_name);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_insert()',
                   'outbox_notify_insert', table_name);
END
$$;

-- The tables that exist get their columns, indexes, functions and trigger in 0014, one table and one
-- statement at a time, the indexes built concurrently: here, in one transaction, they held every write to
-- every outbox table for as long as the builds took (1.85 s at a million rows).
