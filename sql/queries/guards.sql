-- Named queries of the guards of migrations 0017 and 0018: who holds a table's ordering locks.

-- name: outbox_ordering_lock_holders
-- The sessions holding this table's ordering lock stripes (outbox_ordering_lock_holders, migration 0018), with for
-- how long at least (NULL where the owner may not read other sessions' activity): pid, application name, login,
-- never what they run. %(now)s: the test clock.
SELECT h.pid, h.application_name, h.login, h.stripes, h.exclusive, h.outside_transaction,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - h.held_since)::float8 AS held_s
FROM outbox_ordering_lock_holders(%(table_name)s) AS h
ORDER BY h.pid
