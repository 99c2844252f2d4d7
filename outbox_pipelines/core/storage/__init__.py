"""Storage: where the database is and everything said to it. Nothing here knows about destinations or Dagster.

- Where the database is: ``db`` (``OUTBOX_DATABASE_URL`` or the embedded default; it re-exports the names
  callers import from ``db``), ``database_url`` (a URL read as libpq reads it, and shown masked),
  ``project_dir`` (the project's root and its private ``.outbox/``), ``embedded`` (the embedded PostgreSQL
  started and stopped), ``embedded_socket`` (its private socket directory), ``embedded_as_root`` (its own
  user and data directory when run as root).
- Connections: ``connections`` (``connect``, ``driver_connection``), what changes behind a connection
  pooler (``pooler``), and what an application passes to enqueue, resolved and checked (``app_connections``).
- The schema and its forward-only migrations (``migrate``, ``schema``); the least-privilege roles (``roles``,
  their rights declared in ``role_grants``); the versions a process needs against the database's
  (``schema_version``) and its drift from what the migrations define (``schema_drift``, reading them with
  ``schema_definitions``).
- Statements: the named queries of sql/queries composed per table (``queries``) and the modules that run
  them, one method a statement: ``table`` (``OutboxTable``, composed of ``table_enqueue``, ``table_claims``,
  ``table_lock_and_audit``, ``table_maintenance`` and ``table_reads`` on ``statements``; enqueue's statements on
  an asyncio connection: ``table_enqueue_async``) and
  ``shared_tables`` (``SharedTables``).
"""
