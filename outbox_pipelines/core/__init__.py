"""The framework-free engine: rooms of one job each, shared values at the top.

- shared values: ``models`` (messages, outcomes, states), ``errors``, ``canonical`` (canonical JSON),
  ``retry`` (backoff), ``names`` (identifiers validated and quoted), ``redaction`` (no secret shown),
  ``listen`` (where a server may listen), ``settings/`` (outbox.toml and the environment), and
  ``enqueue`` (the application's side: a message written in the business transaction, sync or asyncio),
  with ``prepare`` (the message checked and made into its row, for every path).
- ``storage/``: connections, schema, migrations, named queries, roles, the pooler.
- ``relay/``: claim → dispatch → settle, the circuit, the lease keeper, ordering per key.
- ``destinations/``: where messages go (HTTP, handlers, brokers, the paper broker) and how each is built.
- ``operations/``: maintenance, replay, backfill.
- ``oncall/``: health, alerts, liveness, metrics, tracing, the on-call sweep.

Nothing under this package imports Dagster or Starlette, nor a wing (the order product in
``orders``, the examples: core/wings.py): import-linter contracts in pyproject.toml keep it so.
"""
