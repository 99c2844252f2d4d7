"""What the order product brings to the engine (core/wings.py): the part ``orders`` a project declares.

The ``orders`` destination, the shipped ``outbox_orders`` table and its ``orders`` retry preset, its shared
tables (``idempo_ledger``, ``outbox_api_secret``), its role ``outbox_order_api`` and its rights beside the
engine's roles. Why those rights: docs/explanation/orders.md, "What the wing brings".
"""

from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines.core.storage.roles import MAINTAINER, MESSAGE_COLUMNS, RELAY, Grant, OnColumns, RoleSpec
from outbox_pipelines.core.wings import Wing
from outbox_pipelines.orders import ORDERS_TABLE, SHIPPED_TABLES
from outbox_pipelines.orders.ledger import delete_expired

ORDER_API = "outbox_order_api"
LEDGER = "idempo_ledger"
# What the order broker's settle writes in idempo_ledger (ledger.sql, idempo_ledger_settle): the outcome.
LEDGER_OUTCOME_COLUMNS = ("status", "result", "result_digest", "response", "http_status", "reason", "updated_at")
_RECORD_ORDER_OUTCOMES = (OnColumns("UPDATE", LEDGER_OUTCOME_COLUMNS),)

ORDER_API_ROLE = RoleSpec(
    ORDER_API,
    "the Order API (outbox-pipelines order-api)",
    (
        # SELECT on the whole table: its /metrics reads the table's health as the reader does.
        # INSERT of a message only (Outbox.enqueue): an order's delivery is the relay's to write.
        Grant(ORDERS_TABLE, ("SELECT",), (OnColumns("INSERT", MESSAGE_COLUMNS),)),
        Grant(LEDGER, ("SELECT", "INSERT")),
        Grant("outbox_api_secret", ("SELECT", "INSERT")),
        Grant("outbox_destination_health", ("SELECT",)),
        Grant("outbox_schema_migrations", ("SELECT",)),  # it checks the migrations as it starts
    ),
)

WING = Wing(
    name="orders",
    destinations={"orders": "outbox_pipelines.orders.broker:build_order_broker"},
    url_destinations=("orders",),
    shipped_tables=SHIPPED_TABLES,
    retry_presets={"orders": RetryPolicy(base_s=2.0, max_s=256.0, max_attempts=8, jitter=0.1)},
    preset_attempts_from={"orders": "retry_max"},
    shared_tables={
        LEDGER: "the Order API's idempotency ledger",
        "outbox_api_secret": "the Order API's server secret",
    },
    roles=(ORDER_API_ROLE,),
    engine_role_grants={
        RELAY: (Grant(LEDGER, ("SELECT",), _RECORD_ORDER_OUTCOMES),),
        MAINTAINER: (Grant(LEDGER, ("SELECT", "DELETE"), _RECORD_ORDER_OUTCOMES),),
    },
    producer_excluded_tables=(ORDERS_TABLE,),
    shared_cleanups={LEDGER: delete_expired},
    migrations="parts/orders",
)
