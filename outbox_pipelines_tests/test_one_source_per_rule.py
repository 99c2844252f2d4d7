"""One source per rule: a URL's credentials are masked, a duration is worded and a message's limits are written
in one module each, so that changing the rule is one edit; each test below fails when a second copy appears."""

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "outbox_pipelines"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_only_redaction_writes_the_mask_that_hides_a_credential() -> None:
    """Every credential shown masked goes through core/redaction.py (``mask_url``, ``redact_text``, ``Scrubber``,
    its ``MASK``): a module writing "***" itself is a second masking rule."""
    masking = []
    for name, tree in _modules():
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "***" in node.value
                and id(node) not in docstrings
            ):
                masking.append(f"{name}:{node.lineno}")
    assert masking, "core/redaction.py no longer holds the mask: this test reads the wrong place"
    elsewhere = [where for where in masking if not where.startswith("outbox_pipelines/core/redaction.py:")]
    assert not elsewhere, f"a credential masked outside core/redaction.py (use mask_url or MASK): {elsewhere}"


_UNIT_WORDS = {"ms", "s", "min", "m", "h", "d"}
_UNIT_SIZES = {60, 3600, 86400}
DURATION_SOURCE = "outbox_pipelines/core/durations.py"


def _worded(node: ast.expr | None) -> bool:
    """Whether ``node`` is a duration worded by hand: "{n} min", "{n:.1f}s", or a choice of such (``a if c else b``)."""
    if isinstance(node, ast.IfExp):
        return _worded(node.body) or _worded(node.orelse)
    return (
        isinstance(node, ast.JoinedStr)
        and len(node.values) == 2
        and isinstance(node.values[0], ast.FormattedValue)
        and isinstance(node.values[1], ast.Constant)
        and str(node.values[1].value).strip() in _UNIT_WORDS
    )


def _divides_into_units(node: ast.JoinedStr) -> bool:
    """An f-string dividing a value by a minute, an hour or a day: seconds worded in a larger unit by hand."""
    return any(
        isinstance(part, ast.BinOp)
        and isinstance(part.op, (ast.Div, ast.FloorDiv))
        and isinstance(part.right, ast.Constant)
        and part.right.value in _UNIT_SIZES
        for value in node.values
        if isinstance(value, ast.FormattedValue)
        for part in ast.walk(value.value)
    )


def test_only_one_function_words_a_duration() -> None:
    """``duration_words`` (core/durations.py) is how a duration is shown: no other function returns a
    duration worded by itself, and no message divides seconds into minutes, hours or days itself."""
    wording = []
    for name, tree in _modules():
        if name == DURATION_SOURCE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and _worded(node.value):
                wording.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.JoinedStr) and _divides_into_units(node):
                wording.append(f"{name}:{node.lineno}")
    assert not wording, f"a duration worded outside {DURATION_SOURCE} (use duration_words): {sorted(set(wording))}"


def test_the_duration_wording() -> None:
    from outbox_pipelines.core.durations import duration_words

    shown = [duration_words(s) for s in (None, 0, 0.25, 4.5, 59, 120, 150, 3600, 7200, 9000, 7 * 86400)]
    assert shown == ["-", "0 s", "250 ms", "4.5 s", "59 s", "2 min", "2.5 min", "60 min", "2 h", "2.5 h", "7 d"]


LIMITS_SOURCE = "outbox_pipelines/core/models.py"
# Not a message's limit: AMQP 0-9-1's short string (a routing key, a message id) is 255 bytes by the protocol.
OTHER_255 = {"outbox_pipelines/core/destinations/rabbitmq/destination.py"}


def test_a_messages_limits_are_written_once() -> None:
    """The longest event_id and ordering_key are named constants in core/models.py, read by every enqueue path
    (core/prepare.py: one message, a batch, sync, asyncio, Django): no engine module writes 255 itself."""
    from outbox_pipelines.core import models

    assert models.MAX_EVENT_ID_CHARS == models.MAX_ORDERING_KEY_CHARS == 255
    written = [
        f"{name}:{node.lineno}"
        for name, tree in _modules()
        if name.startswith("outbox_pipelines/core/") and name != LIMITS_SOURCE and name not in OTHER_255
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value == 255
    ]
    assert not written, f"255 written outside {LIMITS_SOURCE}: {written}"
