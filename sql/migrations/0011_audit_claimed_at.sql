-- When the attempt an audit row ends was claimed (issue 28). Under claim = "auto" a batch that is
-- dispatched quickly is held in a transaction and written once, at its settle: that one audit row per
-- attempt then says when it was claimed, by which worker (`worker`), how it ended and when (`created_at`).
ALTER TABLE outbox_audit ADD COLUMN claimed_at timestamptz;

-- claim = "auto" holds a quick batch in the relay's transaction, so a relay that dies mid-batch leaves its
-- rows as they were, their attempt not counted. Before dispatching a batch it notes the ids it holds and
-- their attempts here (one row write per batch, not per message), as runs of consecutive ids at one
-- attempt count (held_from[i]..held_to[i] at held_attempts[i]: a batch is usually one or a few runs, so
-- the note stays small); burying a dead relay counts that attempt, so a message that kills its relay
-- still reaches dead (DESIGN.md §3.3).
ALTER TABLE outbox_relay_workers
    ADD COLUMN held_from     bigint[],
    ADD COLUMN held_to       bigint[],
    ADD COLUMN held_attempts integer[];
