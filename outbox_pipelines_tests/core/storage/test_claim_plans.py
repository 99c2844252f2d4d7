"""What a claim computes, it computes for the rows it locks only.

With relays competing for a table, a claim's scan reads the rows the other relays hold and skips
them at the row lock (SKIP LOCKED): with 4 relays, 4 rows in 5. Anything computed below the lock
(the text of a payload, say) is computed for those rows too; measured, that cost the server a third
more CPU per message drained. So below each lock a claim reads plain columns, and nothing else.
"""

import re
from typing import Any

import pytest

from outbox_pipelines.core.storage.queries import table_query

ORDERS = "outbox_orders"
# A column of the claimed table, or a constant: nothing the server computes per row.
PLAIN_OUTPUT = re.compile(r"t(_\d+)?\.\w+|NULL::text")

PARAMS: dict[str, Any] = {
    "table_name": ORDERS,
    "worker": "plan-check",
    "limit": 100,
    "lease_s": 30.0,
    "paused_topics": [],
    "max_attempts": 10,
    "audit_claims": True,
    "fast_commit": True,
    "gated": True,
    "now": None,
    "hold_timeout_ms": 30_000,
    "max_bytes": 16 * 1024 * 1024,
}


def lock_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if node["Node Type"] == "LockRows" else []
    for child in node.get("Plans", []):
        found += lock_nodes(child)
    return found


@pytest.mark.parametrize("query", ["outbox_claim", "outbox_claim_held"])
def test_a_claim_reads_only_plain_columns_below_its_row_locks(conn, query):
    statement = table_query(query, ORDERS)
    params = {name: value for name, value in PARAMS.items() if f"%({name})s" in statement}
    (plan,) = conn.execute("EXPLAIN (VERBOSE, COSTS OFF, FORMAT JSON) " + statement, params).fetchone().values()
    locks = lock_nodes(plan[0]["Plan"])
    assert locks, "the claim locks its rows (FOR UPDATE SKIP LOCKED)"
    for lock in locks:
        for scan in lock["Plans"]:
            computed = [output for output in scan["Output"] if not PLAIN_OUTPUT.fullmatch(output)]
            assert computed == [], f"{query} computes {computed} for every row it reads, held or not"
