"""Storage: where the database is and everything said to it.

Connections and the embedded default (``db``), the schema and its forward-only migrations (``migrate``,
``schema``), the named queries of sql/queries composed per table (``queries``) and the engine module that
runs them (``table``: one method a statement), the least-privilege roles (``roles``) and what changes
behind a connection pooler (``pooler``). Nothing here knows about destinations or Dagster.
"""
