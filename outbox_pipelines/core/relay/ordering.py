"""Ordered delivery per key, the parts that run beside the relay's cycle (the claim and the settle do the rest:
sql/queries/outbox.sql, migration 0010): ``release_contended`` (keys a settle could not release), ``sweep``
(the backstop) and ``skip_dead_heads`` (the operator's skip).

The rule they keep: docs/explanation/ordering-keys.md, "Writer, claim, settle, sweep".
"""

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import TableSettings
from outbox_pipelines.core.settings.values import free_text
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import OutboxTable

# A writer holds a key's lock from its commit-time check to the end of its commit: a few milliseconds.
_RELEASE_TRIES = 20
_RELEASE_PAUSE_S = 0.005
# A relay with keys still held idles at most this long (relay/loop.py's idle), and tries them again once
# CONTENDED_EVERY_S has passed since its last try.
CONTENDED_RETRY_S = 0.005
# A running relay tries its held keys again at most this often: with 4 relays draining keys, another relay's settle
# held a stripe of a fifth of each batch's keys, and a try after every batch cost a statement per batch.
CONTENDED_EVERY_S = 0.025
_last_try: "weakref.WeakKeyDictionary[OutboxTable, float]" = weakref.WeakKeyDictionary()
SWEEP_PAGE = 500
SKIP_POLICY_REASON = "the table's ordering policy is skip"


def release_contended(
    outbox_table: OutboxTable,
    *,
    patient: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Release the keys the settles left contended; the keys still held after a few tries stay for the
    next call (and the sweep). Run outside a transaction: a writer's commit waits for ours.

    Not ``patient`` (a running relay): one try and no wait; the relay tries the rest after its next batch,
    or after a short idle (CONTENDED_RETRY_S). Most contended keys were held by another relay's settle,
    not by a writer, and that settle has committed by then; waiting here cost a 4-relay keyed drain a
    fifth of its time and every keyed message at a trickle a few milliseconds. Not patient, at most one
    try per CONTENDED_EVERY_S: the keys wait for the next (the sweep's backstop is unchanged). Patient when
    a relay ends, and in maintenance."""
    if not outbox_table.contended_keys:
        return []
    if patient:
        _last_try.pop(outbox_table, None)
    else:
        now = clock()
        if now - _last_try.get(outbox_table, float("-inf")) < CONTENDED_EVERY_S:
            return sorted(outbox_table.contended_keys)
        _last_try[outbox_table] = now
    for attempt in range(_RELEASE_TRIES if patient else 1):
        if not outbox_table.release_contended():
            return []
        if not patient:
            break
        sleep(_RELEASE_PAUSE_S * (attempt + 1))
    return sorted(outbox_table.contended_keys)


@dataclass
class SweepCursor:
    """Where a relay's ordering sweep goes on from (keys after ``after_key``); '' starts a round."""

    after_key: str = ""
    released: int = 0


def sweep(
    outbox_table: OutboxTable, table: TableSettings, cursor: SweepCursor, *, worker: str, page: int = SWEEP_PAGE
) -> int:
    """One page of the backstop: keys whose head waits with nothing before it are released, and under
    ``ordering = "skip"`` parked dead heads are passed over. How many keys it let go."""
    freed = 0
    if table.ordering == "skip":
        freed += sum(
            1
            for row in outbox_table.skip_dead_heads(
                worker, ids=None, ordering_key=None, reason=SKIP_POLICY_REASON, dry_run=False, limit=page
            )
            if row["skipped"]
        )
    row = outbox_table.unblock_sweep(after_key=cursor.after_key, limit=page)
    cursor.after_key = row["last_key"] or ""
    freed += len(row["released"])
    cursor.released += freed
    return freed


def sweep_all(outbox_table: OutboxTable, table: TableSettings, *, worker: str, page: int = SWEEP_PAGE) -> int:
    """A whole round of ``sweep`` (maintenance): every key with waiting messages is looked at once."""
    cursor = SweepCursor()
    freed = sweep(outbox_table, table, cursor, worker=worker, page=page)
    while cursor.after_key:
        freed += sweep(outbox_table, table, cursor, worker=worker, page=page)
    return freed


@dataclass
class SkipReport:
    table: str
    dry_run: bool
    # (id, ordering_key, error code) of each parked dead head found
    matched: list[tuple[int, str, str | None]] = field(default_factory=list)
    skipped: int = 0

    @property
    def keys(self) -> list[str]:
        return sorted({key for _, key, _ in self.matched})

    @property
    def summary(self) -> str:
        """One sentence for the CLI and the Dagster run."""
        if not self.matched:
            return (
                f"{self.table}: no parked dead message matches (a skip applies to a dead message with an "
                "ordering key that it still blocks; 'outbox-pipelines status' lists them). Nothing changed."
            )
        keys = f"{len(self.keys)} key{'' if len(self.keys) == 1 else 's'}"
        if self.dry_run:
            return (
                f"dry run: nothing changed. {len(self.matched)} dead message(s) would be passed over and the "
                f"rest of {keys} would go on without them; run again without the dry run to do it."
            )
        return (
            f"{self.table}: {self.skipped} dead message{'' if self.skipped == 1 else 's'} passed over (still "
            f"dead, audited as outbox_skip, replayable); the later messages of {keys} go on in order."
        )


def skip_dead_heads(
    url: str,
    table: TableSettings,
    *,
    ids: Sequence[int] | None = None,
    ordering_key: str | None = None,
    dry_run: bool = False,
    worker: str = "operator",
    reason: str = "skipped by an operator",
    limit: int = 1000,
) -> SkipReport:
    """Pass over parked dead messages, named by id or by key: they stay dead (replayable, audited as
    outbox_skip), and the later messages of their keys go on in order. ``dry_run`` shows them only."""
    if not ids and ordering_key is None:
        raise ConfigError(
            f"a skip names the dead messages to pass over: their ids (--id, repeatable; ids in "
            f"skip_dead_job) or their ordering key (--key; ordering_key). Nothing was touched; "
            f"'outbox-pipelines status --table {table.name}' names the blocked keys and their dead "
            f"messages."
        )
    reason = free_text(reason, "reason")  # kept in the audit: one printable line, no terminal escape
    report = SkipReport(table.name, dry_run)
    with connect(url) as conn:
        outbox_table = OutboxTable(conn, table.name)
        rows = outbox_table.skip_dead_heads(
            worker,
            ids=list(ids) if ids else None,
            ordering_key=ordering_key,
            reason=reason,
            dry_run=dry_run,
            limit=limit,
        )
        release_contended(outbox_table)
    report.matched = [(row["id"], row["ordering_key"], row["last_error_code"]) for row in rows]
    report.skipped = sum(1 for row in rows if row["skipped"])
    return report
