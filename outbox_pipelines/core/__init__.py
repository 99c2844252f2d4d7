"""The framework-free engine: rooms of one job each, shared values at the top.

Nothing under this package imports Dagster or Starlette, nor a wing (import-linter contracts in pyproject.toml).
The rooms: docs/explanation/codebase.md, "The engine's rooms".
"""
