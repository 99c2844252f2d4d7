"""The hand-written reference of the single-row enqueue: the plain INSERT an application would write.

The drain and latency references are the simplest loop (obench/peers.py); the
copies of our own claim and settle SQL that used to live here were a ceiling
made of our own statements, which cannot show what those statements cost
(issue 12), and are gone.
"""

from psycopg import sql

# The plain outbox INSERT of the enqueue reference: what an application would write by hand,
# with payload text and digest computed beforehand.
PLAIN_INSERT = """
INSERT INTO {table} (event_id, topic, payload, payload_sha, headers)
VALUES (%s, %s, %s::jsonb, %s, %s::jsonb)
"""


def bind(text: str, table: str) -> bytes:
    """The statement with the quoted table name filled in, as bytes psycopg sends as-is.

    Bytes (not a Composed) so the reference pays no per-call composition cost;
    psycopg still prepares it server-side after a few executions, as it does
    for the core's statements.
    """
    return sql.SQL(text.strip()).format(table=sql.Identifier(table)).as_string().encode()
