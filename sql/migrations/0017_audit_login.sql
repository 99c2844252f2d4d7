-- Who wrote each audit row, as the database knows it (issue 42): `worker` is what a process calls itself,
-- `login` the database login it connected as (session_user: SET ROLE and SECURITY DEFINER functions leave it
-- as it is) and `xact` the transaction it wrote the row in. Both are filled in by their defaults, and `db grant`
-- gives no role INSERT on them; a login that may write them anyway (a grant made by hand) is refused by the
-- trigger below. Rows written before this migration have neither (NULL).
ALTER TABLE outbox_audit ADD COLUMN IF NOT EXISTS login text, ADD COLUMN IF NOT EXISTS xact xid8;
ALTER TABLE outbox_audit ALTER COLUMN login SET DEFAULT session_user,
    ALTER COLUMN xact SET DEFAULT pg_current_xact_id();

-- A relay's worker id belongs to the login that registered it: an audit row that names the worker of another
-- login is refused, so one login cannot write history in another's relay's name. Stamped on insert, kept on
-- every update (a heartbeat, a re-registration, the liveness sweep burying it); NULL for rows older than this.
ALTER TABLE outbox_relay_workers ADD COLUMN IF NOT EXISTS login text;

CREATE OR REPLACE FUNCTION outbox_relay_worker_login() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.login := session_user;
    ELSE
        NEW.login := OLD.login;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_relay_worker_login ON outbox_relay_workers;
CREATE TRIGGER outbox_relay_worker_login BEFORE INSERT OR UPDATE ON outbox_relay_workers
    FOR EACH ROW EXECUTE FUNCTION outbox_relay_worker_login();

-- Once per statement that writes audit rows (a relay's settle writes a batch's rows in one): a row whose login or
-- transaction is not its writer's, or whose worker another login registered, fails the statement. One query over
-- the statement's rows and the few distinct workers they name: a delivery's audit row gains no trigger call of its
-- own. SECURITY DEFINER with a fixed search_path: the caller can neither hide outbox_relay_workers behind a
-- table of its own nor redefine the operators compared here.
DO $migration$
BEGIN
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION outbox_audit_written() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
        DECLARE
            forged boolean;
            claimed text;
        BEGIN
            SELECT a.login IS DISTINCT FROM session_user::text OR a.xact IS DISTINCT FROM pg_current_xact_id(),
                   w.worker
              INTO forged, claimed
              FROM (SELECT DISTINCT r.login, r.xact, r.worker FROM written AS r) AS a
              LEFT JOIN %1$I.outbox_relay_workers AS w
                ON w.worker = a.worker AND w.login IS NOT NULL AND w.login <> session_user::text
             WHERE a.login IS DISTINCT FROM session_user::text OR a.xact IS DISTINCT FROM pg_current_xact_id()
                OR w.worker IS NOT NULL
             LIMIT 1;
            IF forged THEN
                RAISE EXCEPTION 'an audit row''s login and transaction are the database''s to write'
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'leave out the columns login and xact: their defaults name who wrote the row';
            END IF;
            IF claimed IS NOT NULL THEN
                RAISE EXCEPTION 'worker %% belongs to another login: an audit row names its own writer''s worker',
                    quote_literal(claimed) USING ERRCODE = 'insufficient_privilege';
            END IF;
            RETURN NULL;
        END
        $body$ $fn$, current_schema());
END
$migration$;

DROP TRIGGER IF EXISTS outbox_audit_written ON outbox_audit;
CREATE TRIGGER outbox_audit_written AFTER INSERT ON outbox_audit REFERENCING NEW TABLE AS written
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_audit_written();
