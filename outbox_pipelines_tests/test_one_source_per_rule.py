"""One source per rule: a URL's credentials are masked, a duration is worded, a message's limits are written and
the states, codes, stop reasons and severities are named in one module each (``StrEnum``s whose values are the
stored strings), so that changing a rule is one edit; each test below fails when a second copy appears."""

import ast
import re
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


_RE_FUNCTIONS = {"compile", "sub", "subn", "match", "fullmatch", "search", "split", "findall", "finditer"}


def test_only_redaction_reads_a_urls_user_info() -> None:
    """No module but core/redaction.py holds a pattern that reads a URL's user-info or a password (an "@" with a
    ":", or a password= key): one algorithm decides where a password ends, for every URL the package shows."""
    patterns = []
    for name, tree in _modules():
        if name == "outbox_pipelines/core/redaction.py":
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in _RE_FUNCTIONS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                pattern = node.args[0].value
                if ("@" in pattern and ":" in pattern) or "password" in pattern.lower():
                    patterns.append(f"{name}:{node.lineno}: {pattern}")
    assert not patterns, f"a URL's credentials read outside core/redaction.py: {patterns}"


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


SQL = REPO / "sql"


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", text))


def test_the_stored_states_are_those_the_migrations_allow() -> None:
    """``MessageState``'s stored members are exactly what the newest table definition's CHECK constraint allows,
    and every state the named SQL compares or writes is one of them (or ``deleted``: a settle that deletes the
    row under ``on_success = "delete"`` answers so; no row holds it)."""
    from outbox_pipelines.core.models import STATES, STORED_STATES, MessageState

    checks = [
        match.group(1)
        for path in sorted((SQL / "migrations").glob("*.sql"))
        for match in re.finditer(r"CHECK \(status IN \(([^)]*)\)\)", path.read_text(encoding="utf-8"))
    ]
    assert checks, "no CHECK (status IN (...)) in sql/migrations: this test reads the wrong place"
    assert _quoted(checks[-1]) == {state.value for state in STORED_STATES}
    assert STATES == tuple(MessageState) and set(STORED_STATES) <= set(STATES)
    written = set()
    for path in sorted((SQL / "queries").glob("*.sql")):
        if path.name == "ledger.sql":  # the order product's ledger: states of its own
            continue
        text = path.read_text(encoding="utf-8")
        written |= set(re.findall(r"\bstatus\s*(?:=|<>|!=)\s*'([a-z_]+)'", text, re.IGNORECASE))
        for listed in re.findall(r"\bstatus\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", text, re.IGNORECASE):
            written |= _quoted(listed)
    assert written and written - {"deleted"} <= {state.value for state in STORED_STATES}, written


def test_the_codes_the_sql_writes_are_members() -> None:
    """Every audit code and error code the named SQL writes is a member of ``AuditCode`` or ``ErrorCode``."""
    from outbox_pipelines.core.models import AuditCode, ErrorCode

    text = (SQL / "queries" / "outbox.sql").read_text(encoding="utf-8")
    audits = set(re.findall(r"'(outbox_flush_[a-z_]+)'", text))
    # Upper-case words in quotes, but for PostgreSQL's own (an encoding, a privilege).
    codes = set(re.findall(r"'([A-Z][A-Z0-9_]{3,})'", text)) - {"UTF8", "USAGE", "SELECT", "INSERT", "UPDATE", "DELETE"}
    assert audits and audits <= {code.value for code in AuditCode}, audits
    assert codes and codes <= {code.value for code in ErrorCode}, codes


# What a state, an outcome's kind, a severity, a stop reason or a run's outcome is read from, where compared.
_COMPARED = {"status", "kind", "severity", "stopped_because", "outcome"}
_WORDS = {
    *("pending", "retrying", "sending", "sent", "dead", "retry"),
    *("ok", "info", "warn", "warning", "error", "healthy", "failing"),
    *("stop requested", "time budget used", "nothing ready", "another relay holds the single-active lock"),
    *("destination_failing", "dead_letters", "delivered", "idle", "table_problems"),
}
# Modules another part of the work owns (the claim and settle path): their literals are converted with it.
_NOT_YET: set[str] = set()


def _compared_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def test_states_codes_and_severities_are_compared_as_members() -> None:
    """A module comparing a message's state, an outcome's kind, a check's or an alert's severity or a relay's stop
    reason compares it with the enum's member (``MessageState.DEAD``), never with a bare string: the string is
    written once, in the enum."""
    bare = []
    for name, tree in _modules():
        if name in _NOT_YET:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare) or _compared_name(node.left) not in _COMPARED:
                continue
            for right in node.comparators:
                values = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
                if any(isinstance(v, ast.Constant) and v.value in _WORDS for v in values):
                    bare.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not bare, bare


def test_each_kind_of_severity_has_a_name_of_its_own() -> None:
    """``CheckSeverity`` (ok, warn, error) and ``AlertSeverity`` (ok, info, warning, error): no module defines
    another type called ``Severity``."""
    from outbox_pipelines.core.models import CheckSeverity
    from outbox_pipelines.core.oncall.alerts import AlertSeverity, alert_severity

    named = [
        f"{name}:{node.lineno}"
        for name, tree in _modules()
        for node in tree.body
        if (isinstance(node, ast.ClassDef) and node.name == "Severity")
        or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "Severity" for t in node.targets))
    ]
    assert not named, named
    assert [alert_severity(grade) for grade in CheckSeverity] == [
        AlertSeverity.OK,
        AlertSeverity.WARNING,
        AlertSeverity.ERROR,
    ]
