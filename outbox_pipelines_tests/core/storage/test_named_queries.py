"""The named statements of sql/queries as the drivers read them: sent without their comments (psycopg would read a
placeholder in one) nor their indentation, and asyncpg takes them renumbered ``$1, $2`` (``numbered_table_query``)."""

import re

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from outbox_pipelines.core.storage.queries import named_queries, numbered_table_query, parse_named_queries, table_query


def test_comments_explain_a_statement_in_sql_but_are_not_sent():
    """A ``%(x)s`` in a comment would be a parameter psycopg asks for, and the relay's commented claims and settles
    were longer than psycopg caches its parse of: sent without them, a string literal kept as written."""
    text = """-- name: q
-- Why this statement exists, citing %(nothing)s.
SELECT 1 AS one  -- a trailing note
     , 'a -- b' AS kept  -- on a line with a quote: kept whole
     , 'first line
-- inside the literal
last line' AS literal
-- name: other
SELECT 2
"""
    queries = parse_named_queries(text)
    assert queries["q"] == (
        "SELECT 1 AS one\n"
        ", 'a -- b' AS kept  -- on a line with a quote: kept whole\n"
        ", 'first line\n-- inside the literal\nlast line' AS literal"
    )
    assert queries["other"] == "SELECT 2"
    assert not [name for name, sent in named_queries().items() if "%(nothing)s" in sent or sent.startswith("--")]


# What a relay sends at every batch: each must stay within psycopg's parse cache, or it is parsed again at each call.
HOT = ("outbox_claim", "outbox_claim_held", "outbox_settle_sent", "outbox_lease_held", "outbox_renew_leases")


@pytest.mark.parametrize("name", HOT)
def test_a_relay_s_statements_fit_psycopg_s_parse_cache_and_name_themselves(name):
    sent = table_query(name, "t" * 63)
    assert len(sent) <= MAX_CACHED_STATEMENT_LENGTH, f"{name}: {len(sent)} characters"
    assert sent.startswith(f"-- {name}\n")  # what pg_stat_activity shows of it


def test_renumbered_for_asyncpg_a_statement_keeps_its_parameters_in_order():
    text, order = numbered_table_query("outbox_insert_many", "outbox_events")
    # Numbered in the order they first appear; a name used twice is one number.
    assert order == ("now", "event_ids", "tenant_ids", "topics", "payloads", "payload_shas", "headers", "available_ats")
    assert "%" not in text.split("INSERT", 1)[1]
    assert max(int(n) for n in re.findall(r"\$(\d+)", text)) == len(order)
    single, count = numbered_table_query("outbox_insert_keyed", "outbox_events")
    assert count == 8 and "$8" in single and "$9" not in single  # the ordering key once (migration 0018)
