"""The order product (seeds 000 and 001), a wing on the engine.

The engine never imports this package (an import-linter contract): it builds the order broker from the factory
this wing declares and talks to it only through the ``Destination`` protocol. Modules: ``validation``, ``model``,
``ledger``, ``failures``, ``broker``, ``wing``, ``api/`` (docs/explanation/orders.md).
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
