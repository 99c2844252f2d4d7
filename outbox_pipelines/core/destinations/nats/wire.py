"""What a message is on a NATS wire: its subject (checked before sending), its payload as JSON, its
headers, and its size against the server's ``max_payload``.

The subject is the topic with the table's ``topic_prefix`` in front, as written; the headers and payload:
docs/explanation/transports.md, "NATS: the message on the wire".
"""

import json
import re
from typing import Any

import orjson

from outbox_pipelines.core import models as m
from outbox_pipelines.core.destinations.trace_context import context_headers
from outbox_pipelines.core.models import ClaimedMessage, Outcome

# The longest subject sent: a server reads a publish's control line (subject, reply inbox, sizes) up to
# max_control_line (4 KiB by default) and closes the connection past it, for every message in flight.
MAX_SUBJECT_BYTES = 2048
# Whitespace and control characters: a subject is one protocol token.
_NOT_IN_SUBJECT = re.compile(r"[\s\x00-\x1f\x7f]")
# The headers' fixed bytes on the wire: "NATS/1.0\r\n" ... "\r\n".
_HEADER_FRAME = len(b"NATS/1.0\r\n\r\n")
# Subjects remembered (topic -> subject or problem); topics repeat, so this is small in practice.
_SUBJECT_CACHE_MAX = 10_000

# A message ready to publish: (subject, payload, headers).
Prepared = tuple[str, bytes, dict[str, str]]


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` cannot be published to (None if it can): checked before sending, because a server
    either closes the connection over it or stores it where no consumer's filter expects it."""
    if not subject:
        return "the subject is empty"
    if len(subject.encode("utf-8", "surrogatepass")) > MAX_SUBJECT_BYTES:
        return f"the subject is longer than {MAX_SUBJECT_BYTES} bytes"
    if _NOT_IN_SUBJECT.search(subject):
        return f"the subject {subject[:200]!r} holds whitespace or a control character"
    if "*" in subject or ">" in subject:
        return f"the subject {subject[:200]!r} holds a wildcard ('*' or '>'); a message is published to one subject"
    if "" in subject.split("."):
        return f"the subject {subject[:200]!r} has an empty token (a leading, trailing or doubled '.')"
    if subject.startswith("$"):
        return f"the subject {subject[:200]!r} starts with '$', the server's own namespace ($JS, $SYS, $KV ...)"
    return None


def _json(payload: Any) -> bytes:
    """The payload as compact UTF-8 JSON: orjson (a fifth of json.dumps's time), json.dumps for what orjson
    declines (integers past 64 bits, keys that are not strings); both write the same JSON values."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _header_bytes(headers: dict[str, str]) -> int:
    """The size of the headers as nats-py writes them ("Key: value\\r\\n" each, in the frame)."""
    return _HEADER_FRAME + sum(len(k) + len(v.encode()) + 4 for k, v in headers.items())


def too_large(payload: bytes, headers: dict[str, str], max_payload: int) -> int | None:
    """The message's size on the wire if it is more than ``max_payload``, else None. Counted exactly only
    when an upper bound (4 UTF-8 bytes a character) does not settle it: the bound costs two C-level sums."""
    bound = len(payload) + _HEADER_FRAME + 4 * (len(headers) + sum(map(len, headers)) + sum(map(len, headers.values())))
    if bound <= max_payload:
        return None
    size = len(payload) + _header_bytes(headers)
    return size if size > max_payload else None


class Wire:
    """Messages as one destination publishes them: its ``topic_prefix``, and each topic's subject and
    problem remembered (topics repeat)."""

    def __init__(self, topic_prefix: str) -> None:
        self.topic_prefix = topic_prefix
        self._subjects: dict[str, tuple[str, str | None]] = {}

    def _subject(self, topic: str) -> tuple[str, str | None]:
        known = self._subjects.get(topic)
        if known is None:
            subject = self.topic_prefix + topic
            known = (subject, subject_problem(subject))
            if len(self._subjects) >= _SUBJECT_CACHE_MAX:
                self._subjects.clear()
            self._subjects[topic] = known
        return known

    def prepare(self, message: ClaimedMessage) -> Prepared | Outcome:
        """(subject, payload, headers), or the dead outcome of a message no server would take."""
        subject, problem = self._subject(message.topic)
        if problem is not None:
            return Outcome.dead(m.BAD_REQUEST, f"not published: {problem}")
        try:
            payload = _json(message.payload)
        except (TypeError, ValueError) as exc:
            return Outcome.dead(m.BAD_REQUEST, f"not published: the payload is not JSON: {exc}")
        event_id = message.event_id
        # What a consumer needs, no more: nats-py encodes each header in Python (about 2.5 µs apiece, as much
        # as the rest of a publish), so no Content-Type (the payload is always JSON) and no attempt number.
        headers = {
            "Nats-Msg-Id": event_id,
            "Idempotency-Key": event_id,
            "X-Outbox-Topic": message.topic,
            **context_headers(message),
        }
        return subject, payload, headers
