"""The on-call sensor's cursor: what it last recorded of each table, as a line a person reads on the sensor's
page, and which tables to record on this tick (those whose failing checks changed, then the others in turn,
at most ``most`` a tick, the worst first).

Why so few a tick: docs/explanation/on-call.md, "The on-call sensor's cursor".
"""

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from outbox_pipelines.core.models import SEVERITY_RANK, CheckSeverity, TableHealth
from outbox_pipelines.core.oncall.checks import CheckVerdict

# What a table's checks looked like when recorded: (check, severity) of those that did not pass, worst first.
Signature = tuple[tuple[str, str], ...]

_ENTRY = re.compile(r"(\w+) \(([^)]*)\)")
_CHECK = re.compile(r"(\w+) (warn|error)\b")
_NAME = re.compile(r"\w+")
_REFRESHED = re.compile(r"(?:^| \| )refreshed: (\w+)")


def signature(verdicts: Iterable[CheckVerdict]) -> Signature:
    """The checks that do not pass, worst first then by name (as the cursor lists them)."""
    found = ((v.name, v.severity) for v in verdicts if v.severity != CheckSeverity.OK)
    return tuple(sorted(found, key=lambda c: (-SEVERITY_RANK[c[1]], c[0])))


@dataclass
class Recorded:
    """Each table as last recorded (a healthy one: an empty signature), the last table recorded in turn, and
    the tables not recorded yet (shown only)."""

    states: dict[str, Signature] = field(default_factory=dict)
    refreshed: str | None = None
    waiting: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, cursor: str | None) -> "Recorded | None":
        """The cursor's record; None when it does not read as one (then every table is recorded)."""
        parts = (cursor or "").split(" | ")
        if not any(part.startswith(("failing: ", "warning: ", "healthy: ")) for part in parts):
            return None
        states: dict[str, Signature] = {}
        for part in parts:
            if part.startswith(("failing: ", "warning: ")):
                states.update((table, tuple(_CHECK.findall(checks))) for table, checks in _ENTRY.findall(part))
            elif part.startswith("healthy: "):
                states.update((table, ()) for table in _NAME.findall(part.removeprefix("healthy: ")))
        refreshed = _REFRESHED.search(cursor or "")
        return cls(states, refreshed.group(1) if refreshed else None)

    def render(self) -> str:
        def entries(severity: str) -> str:
            return ", ".join(
                f"{table} ({', '.join(f'{check} {grade}' for check, grade in sig)})"
                for table, sig in sorted(self.states.items())
                if sig and sig[0][1] == severity
            )

        healthy = ", ".join(sorted(table for table, sig in self.states.items() if not sig))
        parts = [
            f"{word}: {listed}"
            for word, listed in (
                (TableHealth.FAILING, entries(CheckSeverity.ERROR)),
                (TableHealth.WARNING, entries(CheckSeverity.WARN)),
                (TableHealth.HEALTHY, healthy),
                ("to record", ", ".join(self.waiting)),
                ("refreshed", self.refreshed or ""),
            )
            if listed
        ]
        return " | ".join(parts) or "healthy: none"


def tables_to_record(
    verdicts: Mapping[str, list[CheckVerdict]],
    before: Recorded | None,
    *,
    every_s: float,
    tick_s: float,
    most: int,
) -> tuple[list[str], Recorded]:
    """(the tables to record now, the cursor's record after it): those changed or never recorded, the worst
    first, then the next ``ceil(tables × tick_s / every_s)`` in turn after the last one taken, at most ``most``."""
    before = before or Recorded()
    tables = sorted(verdicts)
    now = {table: signature(verdicts[table]) for table in tables}
    changed = sorted(
        (t for t in tables if before.states.get(t) != now[t]),
        key=lambda t: (-SEVERITY_RANK[now[t][0][1]] if now[t] else 0, t),
    )
    due = changed[:most]
    per_tick = min(len(tables), math.ceil(len(tables) * tick_s / every_s), most - len(due))
    start = next((i for i, t in enumerate(tables) if before.refreshed is not None and t > before.refreshed), 0)
    in_turn = [tables[(start + i) % len(tables)] for i in range(max(per_tick, 0))]
    due += [t for t in in_turn if t not in due]
    states = {t: now[t] if t in due else before.states[t] for t in tables if t in due or t in before.states}
    waiting = [t for t in changed if t not in due and t not in before.states]
    return sorted(due), Recorded(states, in_turn[-1] if in_turn else before.refreshed, waiting)
