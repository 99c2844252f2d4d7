"""The order product (seeds 000 and 001), a wing on the engine.

The engine never imports this package (an import-linter contract in pyproject.toml):
it builds the order broker from the factory this wing declares (``wings.destinations()``, "module:factory",
imported when a table uses it), talks to it only through the ``Destination``
protocol, and reads the shipped orders table from ``SHIPPED_TABLES``.

- ``validation``: the rules of an OrderRequest v1.1
- ``model``: the stored order, its digests, the broker's request and answer
- ``ledger``: the idempotency ledger (accept once per key, look up, record outcomes)
- ``failures``: seed 001's error code of a failed order
- ``broker``: ``OrderBroker``, the destination that executes orders and fills the ledger
"""

from typing import Any

# The outbox table the Order API writes and the order broker drains.
ORDERS_TABLE = "outbox_orders"

# The shipped orders table's defaults (a config file's [tables.outbox_orders] overrides them): orders go to
# the broker at OUTBOX_BROKER_URL (the paper broker when unset), results to the ledger.
SHIPPED_TABLES: dict[str, dict[str, Any]] = {
    ORDERS_TABLE: {
        "destination": "orders",
        "preset": "orders",
        "mode": "competing",
        "timeout": "5s",
        "url_from_env": "broker_url",
    },
}
