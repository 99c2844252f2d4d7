-- The audit detail of a write that lost its lease: settle and renew (sql/queries/outbox.sql)
-- both say it, one way. A STABLE SQL function of one expression, so PostgreSQL inlines it
-- into the calling statement: the plans of outbox_settle and outbox_renew_leases do not change.
CREATE FUNCTION outbox_lease_lost_detail(prefix text, row_exists boolean, status text, locked_by text,
                                         attempts integer)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT prefix || CASE WHEN NOT row_exists THEN 'row no longer exists'
                          ELSE format('lease lost: row is %s, held by %s at attempt %s',
                                      status, coalesce(locked_by, 'nobody'), attempts) END
$$;
