"""The named statements of sql/queries as the drivers read them: psycopg reads a placeholder wherever it stands,
comments included, and asyncpg takes them renumbered ``$1, $2`` (``numbered_table_query``)."""

import re

import pytest

from outbox_pipelines.core.storage.queries import named_queries, numbered_table_query

PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%[sb]")


def _names(lines: list[str]) -> set[str]:
    return {match.group(1) or "%s" for line in lines for match in PLACEHOLDER.finditer(line)}


@pytest.mark.parametrize("name", sorted(named_queries()))
def test_a_comment_names_no_parameter_its_statement_does_not_take(name):
    """A ``%(x)s`` written in a comment is a parameter psycopg asks for: the call fails with 'query parameter
    missing'. Comments may cite only the statement's own parameters."""
    lines = named_queries()[name].splitlines()
    comments = [line for line in lines if line.lstrip().startswith("--")]
    code = [line.split("--")[0] for line in lines if not line.lstrip().startswith("--")]
    assert _names(comments) <= _names(code), f"{name}: a comment names {_names(comments) - _names(code)}"


def test_renumbered_for_asyncpg_a_statement_keeps_its_parameters_in_order():
    text, order = numbered_table_query("outbox_insert_many", "outbox_events")
    # Numbered in the order they first appear; a name used twice is one number.
    assert order == ("now", "event_ids", "tenant_ids", "topics", "payloads", "payload_shas", "headers", "available_ats")
    assert "%" not in text.split("INSERT", 1)[1]
    assert max(int(n) for n in re.findall(r"\$(\d+)", text)) == len(order)
    single, count = numbered_table_query("outbox_insert_keyed", "outbox_events")
    assert count == 8 and "$8" in single and "$9" not in single  # the ordering key once (migration 0018)
