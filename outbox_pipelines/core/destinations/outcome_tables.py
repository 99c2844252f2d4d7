"""Each destination's outcome table in Markdown, rendered from the rows its classifiers answer with
(``outcome_rows``): docs/reference/outcomes.md (HTTP) and docs/destinations.md (each broker) show them, and
outbox_pipelines_tests/test_docs.py fails when a page's copy differs.

``python -m outbox_pipelines.core.destinations.outcome_tables [http|nats|rabbitmq|kafka]`` prints one table
(all of them, each under a heading, when no argument names one).
"""

import importlib
import sys
from dataclasses import dataclass

from outbox_pipelines.core.destinations.outcome_rows import OutcomeRow


@dataclass(frozen=True)
class _Table:
    answer_heading: str  # the first column's heading: what the destination answers
    modules: tuple[str, ...]  # the classifier modules (in this package) whose ROWS make the table, in order


# Imported when rendered: a broker's client is an extra, and the HTTP table needs none of them.
TABLES = {
    "http": _Table("answer", ("http.outcomes", "http.failures")),
    "nats": _Table("the server's answer", ("nats.outcomes",)),
    "rabbitmq": _Table("the broker's answer", ("rabbitmq.outcomes",)),
    "kafka": _Table("librdkafka's report", ("kafka.outcomes",)),
}


def rows(destination: str) -> tuple[OutcomeRow, ...]:
    """The destination's table: its classifier modules' rows, in order."""
    found: list[OutcomeRow] = []
    for name in TABLES[destination].modules:
        module_rows: tuple[OutcomeRow, ...] = importlib.import_module(f"{__package__}.{name}").ROWS
        found.extend(module_rows)
    return tuple(found)


def _cell(text: str) -> str:
    # A "|" inside a cell would end it.
    return text.replace("|", "\\|")


def _row(*cells: str) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def render_markdown(destination: str) -> str:
    """One destination's outcome table: the answer, the outcome (and what follows it), the code."""
    lines = [_row(TABLES[destination].answer_heading, "outcome", "code"), "|---|---|---|"]
    for row in rows(destination):
        lines.append(_row(row.answer, row.outcome_text, f"`{row.code}`" if row.code else ""))
    return "\n".join(lines) + "\n"


def render_all() -> str:
    """Every destination's table, each under a heading."""
    return "\n".join(f"## {destination}\n\n{render_markdown(destination)}" for destination in TABLES)


def main(argv: list[str]) -> int:
    if not argv:
        print(render_all(), end="")
        return 0
    if len(argv) > 1 or argv[0] not in TABLES:
        print(
            f"usage: python -m outbox_pipelines.core.destinations.outcome_tables [{'|'.join(TABLES)}]", file=sys.stderr
        )
        return 2
    print(render_markdown(argv[0]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
