"""A destination's outcome table as data: one row per kind of answer (or of failure to get one), with the
outcome it makes and that outcome's code.

The classifiers (``http/outcomes.py``, ``http/failures.py``, ``nats/outcomes.py``, ``rabbitmq/outcomes.py``,
``kafka/outcomes.py``) make every outcome from a row of their table (``row.outcome(error)``), so the table
cannot say one thing while they do another; ``outcome_tables`` renders the tables the docs show.
"""

from dataclasses import dataclass

from outbox_pipelines.core.models import Outcome, OutcomeKind


@dataclass(frozen=True)
class OutcomeRow:
    """One row: what came back, and the outcome (kind and code) every answer of that kind makes."""

    answer: str  # what came back, or what failed, in the docs' words
    kind: OutcomeKind
    code: str | None = None  # None only for a plain sent
    # What the docs' outcome cell says after the kind (", ref `stream:seq`", " (circuit)"); "" for nothing.
    then: str = ""

    def __post_init__(self) -> None:
        if self.kind != OutcomeKind.SENT and self.code is None:
            raise ValueError(f"a {self.kind} row needs a code: {self.answer!r}")

    @property
    def outcome_text(self) -> str:
        """The docs' outcome cell: the kind, then what the row adds."""
        return f"{self.kind}{self.then}"

    def outcome(self, error: str | None = None, *, ref: str | None = None, delay_s: float | None = None) -> Outcome:
        """This row's outcome for one answer: ``error`` says what came back (retry and dead), ``ref`` what the
        destination named the delivery (sent), ``delay_s`` how long a retry waits at least (Retry-After)."""
        if self.kind == OutcomeKind.SENT:
            return Outcome.sent(ref=ref, code=self.code)
        assert self.code is not None  # __post_init__: every retry and dead row has one
        if self.kind == OutcomeKind.DEAD:
            return Outcome.dead(self.code, error)
        return Outcome.retry(self.code, error, delay_s=delay_s)
