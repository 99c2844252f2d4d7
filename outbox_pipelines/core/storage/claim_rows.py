"""A claim's rows as the relay takes them: each a ClaimedMessage built straight from its columns, or a row the claim
left waiting behind its key's head (sql/queries/outbox.sql, claim_key_behind)."""

from collections.abc import Sequence
from typing import Any, NamedTuple

from psycopg.rows import RowMaker

from outbox_pipelines.core.canonical import loads_jsonb_text
from outbox_pipelines.core.models import ClaimedMessage


class LeftWaiting(NamedTuple):
    """A row a claim locked behind its key's head and left out (sql/'s claim_key_behind), to be marked waiting."""

    id: int
    ordering_key: str


def claimed_row(cursor: object) -> RowMaker[ClaimedMessage | LeftWaiting]:
    return claimed_message


def claimed_message(values: Sequence[Any]) -> ClaimedMessage | LeftWaiting:
    """A claim's row, whose ``body`` is the JSON array [payload, headers] as UTF-8 bytes: one decoding call
    per row, where psycopg's jsonb loader would make two, and two conversions of text more. A row without a
    body is one the claim left waiting behind its key's head."""
    row_id, event_id, tenant_id, topic, body, payload_sha, attempts, created_at, claimed_at, ordering_key = values
    if body is None:
        return LeftWaiting(row_id, ordering_key)
    payload, headers = loads_jsonb_text(body)
    return ClaimedMessage.from_row(
        (
            row_id,
            event_id,
            tenant_id,
            topic,
            payload,
            payload_sha,
            headers,
            attempts,
            created_at,
            claimed_at,
            ordering_key,
        )
    )
