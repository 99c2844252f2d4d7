"""Storage: where the database is and everything said to it. Nothing here knows about destinations or Dagster.

Modules, one job each: docs/explanation/codebase.md, "The storage room's modules".
"""
