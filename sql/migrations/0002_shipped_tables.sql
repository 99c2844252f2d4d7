-- The three outbox tables the product ships (seeds 000, 003, 002/004).
SELECT outbox_create_table('outbox_orders');
SELECT outbox_create_table('outbox_memory', with_dedup_index => true);
SELECT outbox_create_table('outbox_events');
