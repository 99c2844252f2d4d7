"""What a claim computes, it computes for the rows it locks only; each rule the claim modes share is written once.

With relays competing for a table, a claim's scan reads the rows the other relays hold and skips
them at the row lock (SKIP LOCKED): with 4 relays, 4 rows in 5. Anything computed below the lock
(the text of a payload, say) is computed for those rows too; measured, that cost the server a third
more CPU per message drained. So below each lock a claim reads plain columns, and nothing else.
"""

import re
from typing import Any

import pytest

from outbox_pipelines.core.storage.queries import named_queries, sql_dir, table_query

ORDERS = "outbox_orders"
CLAIMS = ("outbox_claim", "outbox_claim_held")
SETTLES = ("outbox_settle", "outbox_settle_sent")
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


@pytest.mark.parametrize("query", CLAIMS)
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


def aliases(node: dict[str, Any]) -> set[str]:
    found = {node["Alias"]} if "Alias" in node else set()
    for child in node.get("Plans", []):
        found |= aliases(child)
    return found


@pytest.mark.parametrize("query", CLAIMS)
def test_a_claim_looks_up_a_key_s_earlier_messages_for_the_rows_it_locked_only(conn, query):
    """The key's head and in-flight probes (claim_key_free: aliases p and f) sit above the row lock, not in the
    scan below it: the rows other relays hold are skipped at the lock before any probe is made for their keys."""
    statement = table_query(query, ORDERS)
    params = {name: value for name, value in PARAMS.items() if f"%({name})s" in statement}
    (plan,) = conn.execute("EXPLAIN (VERBOSE, COSTS OFF, FORMAT JSON) " + statement, params).fetchone().values()
    locks = lock_nodes(plan[0]["Plan"])
    assert locks
    for lock in locks:
        assert not aliases(lock) & {"p", "f"}, f"{query} probes the keys of rows it has not locked"
    assert {"p", "f"} <= aliases(plan[0]["Plan"]), f"{query} checks no key's head"


# Each rule the claim modes share, as written once in sql/queries, and the statements that must name it.
SHARED_PARTS = {
    "claim_gate_open": ("h.circuit_opened_at IS NOT NULL OR h.pause_reason IS NOT NULL", CLAIMS),
    "key_head": (
        "p.ordering_key = t.ordering_key AND (p.ordering_key, p.id) < (t.ordering_key, t.id)",
        ("claim_key_behind", "maintenance_requeue_due"),
    ),
    "claim_key_behind": ("(t.ordering_key IS NOT NULL AND t.ordering_skipped_at IS NULL AND NOT", CLAIMS),
    "claim_key_free": ("WHERE f.ordering_key = t.ordering_key AND f.status = 'sending'", CLAIMS),
    "claim_due": ("AND NOT t.ordering_blocked\nAND (t.topic || '') <> ALL(%(paused_topics)s::text[])", CLAIMS),
    "claim_byte_budget": ("WHERE b.n = 1 OR b.total <= %(max_bytes)s", CLAIMS),
    "settle_fence": ("AND (%(held)s OR t.locked_by = %(worker)s)", SETTLES),
    "settle_conflict_audit": ("'outbox_flush_conflict'", (*SETTLES, "outbox_renew_leases")),
}


@pytest.mark.parametrize("part", sorted(SHARED_PARTS))
def test_a_rule_the_claim_modes_share_is_written_once_and_named_by_each_statement(part):
    rule, statements = SHARED_PARTS[part]
    files = "\n".join(path.read_text() for path in sorted((sql_dir() / "queries").glob("*.sql")))
    assert files.count(rule) == 1, f"{rule!r} is written more than once in sql/queries"
    assert rule in named_queries()[part]
    for name in statements:
        assert "{" + part + "}" in named_queries()[name], f"{name} does not name {part}"
        assert rule in table_query(name, ORDERS)
