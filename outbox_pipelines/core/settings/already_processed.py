"""When a 409 means "already processed": the evidence a table's ``already_processed`` names (or the strict
default), read here when the settings load and by the HTTP destination for each answer."""

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# What a 409's body must say to count as "this idempotency key was already executed"
# (docs/reference/outcomes.md), unless a table names its destination's own words (``already_processed`` in
# outbox.toml). Each rule is either
# ``field=value`` (a JSON object's field, dotted for nesting, equal to the value) or a bare phrase (the whole
# body, as plain text, equal to it); compared without case, with spaces, hyphens and underscores alike and a
# trailing full stop ignored. Strict on purpose: a word found somewhere in the body ("duplicate rejected:
# different order", "not already processed") is a rejection, never a delivery.
DEFAULT_ALREADY_PROCESSED = (
    "status=already_processed",
    "code=already_processed",
    "error=already_processed",
    "already processed",
)
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")


def body_text(body: bytes) -> str:
    return body[:4096].decode("utf-8", errors="replace")


def _normal(value: str) -> str:
    return re.sub(r"[\s_-]+", "_", value.strip().lower()).rstrip(".!")


@dataclass(frozen=True)
class AlreadyProcessed:
    """The evidence by which a 409 means "already processed": JSON fields with a value, or whole phrases."""

    fields: tuple[tuple[tuple[str, ...], str], ...] = ()
    phrases: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rules: Sequence[str], where: str = "already_processed") -> "AlreadyProcessed":
        """From ``field=value`` and phrase rules; ValueError naming the rule that cannot be read."""
        fields, phrases = [], []
        for rule in rules:
            if not isinstance(rule, str) or not rule.strip():
                raise ValueError(f"{where}: each rule is a non-empty string, got {rule!r}")
            name, equals, value = rule.partition("=")
            if not equals:
                phrases.append(_normal(rule))
                continue
            if not _FIELD.fullmatch(name.strip()) or not value.strip():
                raise ValueError(
                    f"{where}: {rule!r} is not field=value (a JSON field, dotted for nesting, "
                    "and the value that means already processed)"
                )
            fields.append((tuple(name.strip().split(".")), _normal(value)))
        return cls(tuple(fields), tuple(phrases))

    def says_so(self, body: bytes) -> bool:
        text = body_text(body)
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            return _normal(text) in self.phrases
        if isinstance(parsed, str):
            return _normal(parsed) in self.phrases
        return any(
            isinstance(found := _field(parsed, path), str) and _normal(found) == value for path, value in self.fields
        )


def _field(document: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(document, dict):
            return None
        document = document.get(name)
    return document


STRICT_ALREADY_PROCESSED = AlreadyProcessed.parse(DEFAULT_ALREADY_PROCESSED)
