"""The framework-free core: model, SQL, relay, policies and destinations.

Nothing under this package imports Dagster or Starlette (an import-linter
contract in pyproject.toml, run by the tests, keeps it so).
"""
