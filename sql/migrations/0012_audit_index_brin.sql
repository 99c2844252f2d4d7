-- outbox: no transaction
-- The audit's index by message, made cheap to write (issue 28).
--
-- Every delivery writes an audit row, so each index on outbox_audit is paid once per message. The b-tree
-- on (outbox_table, message_id) cost about 2 µs of the 6 µs a delivery's audit row adds to its settle
-- (bench/results.md, issue 28), and no statement of the engine reads it: people do, by event id
-- (docs/how-to/on-call.md), which that index did not cover, or by message id. A BRIN index on message_id
-- costs almost nothing per row and keeps a lookup by message id to the block ranges that may hold it; it
-- is minmax-multi, so the id ranges of several outbox tables written side by side stay apart.
-- Built concurrently under a new name, then swapped for the b-tree: the relays' audit writes never wait
-- for it (in a transaction, they waited about 1 s per million audit rows). Each step is safe to repeat.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_audit_by_message_brin ON outbox_audit
    USING brin (message_id int8_minmax_multi_ops);
DROP INDEX CONCURRENTLY IF EXISTS outbox_audit_by_message;
ALTER INDEX outbox_audit_by_message_brin RENAME TO outbox_audit_by_message;
