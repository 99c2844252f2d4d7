-- outbox: no transaction
-- Claims mark the keyed messages they find behind their key's head (expand; its contract step is contract/0002).
--
-- Until now every keyed message inserted while an earlier message of its key held the key waited (ordering_blocked)
-- from its insert, however far back that message was, and cost a second write, its release, when the message before
-- it was delivered. contract/0002 stores a message ready when its key's previous message is far behind it: the claim
-- reads the table in id order, so it reaches that message when the one before has nearly always been delivered. A
-- claim that finds one behind its key's head after all returns it without a body (claim_key_behind,
-- sql/queries/outbox.sql), and the relay marks it waiting with this function, so the next claim reads past it and the
-- key's release lets it go as before. A relay of the previous version marks nothing: with messages stored ready behind
-- a held head at the front of the queue, its every claim would take nothing, and so the insert check changes only in
-- the contract step, once every relay runs this version. Only a function is made: no table is locked, no row read.

-- The rows ``ids`` of table_name that a claim found behind their key's head (claim_key_behind, sql/queries/outbox.sql)
-- wait (ordering_blocked), those still behind it: its own statement, with a snapshot taken now, so a head delivered
-- since the claim's snapshot leaves its next message ready. A head delivered after this, before the caller commits,
-- cannot see the mark: the caller releases the returned keys once its transaction is over (outbox_release_keys_again),
-- as it does the keys a settle found contended. A row another transaction holds (a claim took it since: a leased
-- claim has committed before this runs) is left as it is, never waited for. Run as the caller: a relay may write
-- ordering_blocked.
CREATE OR REPLACE FUNCTION outbox_mark_waiting(table_name text, ids bigint[]) RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    keys text[];
BEGIN
    EXECUTE format($sql$
        WITH behind AS (
            SELECT t.id FROM %1$I AS t
             WHERE t.id = ANY($1) AND t.status = 'pending' AND NOT t.ordering_blocked
               AND t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL
               AND EXISTS (SELECT 1 FROM %1$I AS p
                           WHERE p.ordering_key = t.ordering_key AND (p.ordering_key, p.id) < (t.ordering_key, t.id)
                             AND p.ordering_skipped_at IS NULL AND p.status IN ('pending', 'sending', 'dead'))
             FOR UPDATE OF t SKIP LOCKED
        ), marked AS (
            UPDATE %1$I AS t SET ordering_blocked = true FROM behind AS b WHERE t.id = b.id
            RETURNING t.ordering_key)
        SELECT coalesce(array_agg(DISTINCT m.ordering_key), ARRAY[]::text[]) FROM marked AS m$sql$,
        table_name) USING ids INTO keys;
    RETURN keys;
END
$fn$;
