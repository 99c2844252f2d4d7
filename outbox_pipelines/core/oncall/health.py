"""What an operator asks first: how many rows in each state, how late, how many dead and why.

Two parts: reading a table's state (``table_status``) and grading it into the checks' verdicts
(``checks``); this module gives both under one name.
"""

from outbox_pipelines.core.oncall.checks import CHECK_NAMES, CheckVerdict, evaluate_checks
from outbox_pipelines.core.oncall.table_status import (
    LAG_SAMPLE,
    LAG_WINDOW_S,
    TableStatus,
    read_status,
    ready_count,
)

__all__ = [
    "CHECK_NAMES",
    "LAG_SAMPLE",
    "LAG_WINDOW_S",
    "CheckVerdict",
    "TableStatus",
    "evaluate_checks",
    "read_status",
    "ready_count",
]
