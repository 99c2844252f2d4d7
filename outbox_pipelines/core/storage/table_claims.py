"""Claims and settles: the relay's cycle on one outbox table (claim, settle, renew or give back what it
holds, release ordering keys) and the reads it makes between cycles."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.pq import TransactionStatus

from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.storage.array_literals import bigint_array, text_array
from outbox_pipelines.core.storage.claim_rows import LeftWaiting, claimed_row
from outbox_pipelines.core.storage.queries import claim_query
from outbox_pipelines.core.storage.settlements import Settlement, SettleStatus
from outbox_pipelines.core.storage.statements import NOT_AN_OUTBOX, Row, TableStatements, _prepare, unknown_table


def id_runs(ids: Sequence[int], attempts: Sequence[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """A batch's ids and attempts as runs of consecutive ids at one attempt count: each run's first id, last id,
    attempts, and the 1-based place of its first id in ``ids`` (outbox_settle_sent pairs rows to runs)."""
    first: list[int] = []
    last: list[int] = []
    runs_attempts: list[int] = []
    at: list[int] = []
    for place, (row_id, attempt) in enumerate(zip(ids, attempts, strict=True), start=1):
        if last and row_id == last[-1] + 1 and attempt == runs_attempts[-1]:
            last[-1] = row_id
        else:
            first.append(row_id)
            last.append(row_id)
            runs_attempts.append(attempt)
            at.append(place)
    return first, last, runs_attempts, at


# A claim's byte budget by default (a table's ``batch_bytes``): its rows' bodies (payload and headers as JSON text)
# fit in this many bytes, or it holds one message, larger (outbox_claim's "taken").
DEFAULT_BATCH_BYTES = 16 * 1024 * 1024


class ClaimStatements(TableStatements):
    """Claim, settle and hold messages of one outbox table."""

    def _claimed(self, query: str, params: dict[str, Any], reuse_plan: bool) -> list[ClaimedMessage]:
        """A claim's rows built straight into ClaimedMessage (columns in its field order): no dict per row. The rows
        it found behind their keys' heads are marked waiting (counted in ``left_waiting``), and their keys released
        again once the caller's transaction is over (``contended_keys``): a head delivered before the mark committed
        missed it."""
        statement = claim_query(query, self.table_name, params.pop("limit"))
        try:
            # Binary results: the timestamps cross as integers, not text to format and parse.
            with self.conn.cursor(row_factory=claimed_row, binary=True) as cur:
                cur.execute(statement, {"table_name": self.table_name, **params}, prepare=_prepare(reuse_plan))
                rows = cur.fetchall()
        except NOT_AN_OUTBOX as exc:
            raise unknown_table(self.table_name, exc) from None
        claimed = [row for row in rows if isinstance(row, ClaimedMessage)]
        self.left_waiting = len(rows) - len(claimed)
        if self.left_waiting:
            behind = bigint_array([row.id for row in rows if isinstance(row, LeftWaiting)])
            marked = self._run("outbox_mark_waiting", {"ids": behind, "fast_commit": self._own_transaction()})
            self._note_contended(marked[0]["keys"])
        return claimed

    def _own_transaction(self) -> bool:
        """Whether the next statement is a transaction of its own (an autocommit session outside any transaction):
        only then may it commit without waiting for the WAL flush, which inside a transaction would apply to all."""
        return self.conn.autocommit and self.conn.info.transaction_status == TransactionStatus.IDLE

    def claim(
        self,
        worker: str,
        limit: int,
        lease_s: float,
        *,
        paused_topics: Sequence[str] = (),
        max_attempts: int = 2**31 - 1,
        audit_claims: bool = True,
        fast_commit: bool = False,
        gated: bool = False,
        reuse_plan: bool = False,
        max_bytes: int = DEFAULT_BATCH_BYTES,
        now: datetime | None = None,
    ) -> list[ClaimedMessage]:
        """Due pending rows, and sending rows whose lease expired (re-taken, fenced by the attempt number).

        ``fast_commit``: on an autocommit connection, the claim commits without waiting for the WAL
        flush (the relay's; a lost claim means a redelivery). Inside a caller's transaction it would
        make the whole transaction so: leave it False there. ``gated``: nothing unless the table's
        destination is plainly open (not paused, no throttle probe due, circuit closed).
        ``reuse_plan``: keep the statement's plan for the session (a relay's: generic, relay/session.py).
        ``max_bytes``: the batch's byte budget: its rows' payloads and headers (JSON text) fit in it, or it holds
        the first row alone; the rows left out are not claimed.
        """
        return self._claimed(
            "outbox_claim",
            {
                "worker": worker,
                "limit": limit,
                "lease_s": lease_s,
                "paused_topics": list(paused_topics),
                "max_attempts": max_attempts,
                "audit_claims": audit_claims,
                "fast_commit": fast_commit,
                "gated": gated,
                "max_bytes": max_bytes,
                "now": now,
            },
            reuse_plan,
        )

    def claim_held(
        self,
        limit: int,
        hold_s: float,
        *,
        paused_topics: Sequence[str] = (),
        gated: bool = False,
        reuse_plan: bool = False,
        max_bytes: int = DEFAULT_BATCH_BYTES,
        now: datetime | None = None,
    ) -> list[ClaimedMessage]:
        """Due pending rows locked in the open transaction (claim = "transaction"); ``settle(held=True)``
        in the same transaction ends them. The server ends a transaction left idle for ``hold_s``.
        ``gated``, ``reuse_plan``, ``max_bytes``: as for ``claim`` (a row the budget leaves out stays locked,
        unclaimed, until the transaction ends)."""
        return self._claimed(
            "outbox_claim_held",
            {
                "limit": limit,
                "paused_topics": list(paused_topics),
                "hold_timeout_ms": max(int(hold_s * 1000), 1),
                "gated": gated,
                "max_bytes": max_bytes,
                "now": now,
            },
            reuse_plan,
        )

    def lease_held(
        self,
        worker: str,
        ids: Sequence[int],
        lease_s: float,
        *,
        claimed_at: datetime | None,
        audit_claims: bool = True,
        now: datetime | None = None,
    ) -> dict[int, int]:
        """claim = "auto": lease rows held by this transaction (``claim_held``) as ``claim`` would have, their
        attempt counted; the caller commits. Returns each leased id's attempt (its fencing token)."""
        rows = self._run(
            "outbox_lease_held",
            {
                "worker": worker,
                "ids": bigint_array(ids),
                "lease_s": lease_s,
                "claimed_at": claimed_at,
                "audit_claims": audit_claims,
                "now": now,
            },
        )
        return {row["id"]: row["attempts"] for row in rows}

    def count_died_holding(
        self,
        worker: str,
        dead_holder: str,
        held_from: Sequence[int],
        held_to: Sequence[int],
        attempts: Sequence[int],
        *,
        max_attempts: int,
        pass_over_dead: bool = False,
        now: datetime | None = None,
    ) -> list[Row]:
        """Count the attempt of rows a dead relay held unwritten (claim = "auto"): dead when it was the last.
        The rows are runs of consecutive ids (``held_from[i]..held_to[i]``), each at ``attempts[i]``, the rows'
        attempts when they were claimed. Returns (id, status) of the rows counted."""
        return self._run(
            "outbox_count_died_holding",
            {
                "worker": worker,
                "dead_holder": dead_holder,
                "held_from": bigint_array(held_from),
                "held_to": bigint_array(held_to),
                "attempts": bigint_array(attempts),
                "max_attempts": max_attempts,
                "pass_over_dead": pass_over_dead,
                "now": now,
            },
        )

    def settle_sent(
        self,
        worker: str,
        ids: Sequence[int],
        attempts: Sequence[int],
        *,
        audit_code: str,
        refs: Sequence[str | None] | None = None,
        held: bool = False,
        audit_successes: bool = True,
        fast_commit: bool = False,
        pass_over_dead: bool = False,
        claimed_at: datetime | None = None,
        now: datetime | None = None,
    ) -> set[int]:
        """Mark delivered rows sent (their attempts: the ones claimed): ``settle`` for the common batch with
        nothing else to record. Returns the ids settled; the others lost their lease (audited).

        ``fast_commit``: the settle's transaction commits without waiting for the WAL flush (for leased rows, on an
        autocommit connection, as for ``claim``; held rows: the relay's own transaction).
        """
        first, last, run_attempts, at = id_runs(ids, attempts)
        params = {
            "worker": worker,
            "now": now,
            "held": held,
            "audit_successes": audit_successes,
            "audit_code": audit_code,
            "claimed_at": claimed_at,
            "ids": bigint_array(ids),
            "run_first": bigint_array(first),
            "run_last": bigint_array(last),
            "run_attempts": bigint_array(run_attempts),
            "run_at": bigint_array(at),
            "refs": text_array(refs) if refs is not None else None,
            "fast_commit": fast_commit,
        }
        # Its plan is kept, generic in a relay's session (relay/session.py).
        rows = self._run("outbox_settle_sent", params, reuse_plan=True)
        self._note_contended(rows[0]["contended"])
        lost = rows[0]["lost"]
        return set(ids).difference(lost) if lost else set(ids)

    def settle(
        self,
        worker: str,
        settlements: Sequence[Settlement],
        *,
        held: bool = False,
        audit_successes: bool = True,
        pass_over_dead: bool = False,
        claimed_at: datetime | None = None,
        now: datetime | None = None,
    ) -> set[int]:
        """Apply the outcomes; return the ids settled. Missing ids lost their lease (audited).
        ``claimed_at``: when the batch was claimed, kept on its audit rows.

        ``held``: the rows were claimed with ``claim_held`` in this transaction (their attempt is
        counted now). ``audit_successes`` False: deliveries leave no audit row (audit = "failures").
        ``pass_over_dead``: a keyed message that dies lets the rest of its key go (ordering = "skip").
        Settled keyed messages release their keys; keys a committing writer held are kept in
        ``contended_keys``, for ``release_contended`` once the caller's transaction is over.
        """
        if not settlements:
            return set()
        audit_code = settlements[0].audit_code
        if all(
            s.status == SettleStatus.SENT
            and s.error is None
            and s.error_code is None
            and not s.refund
            and s.audit_code == audit_code
            for s in settlements
        ):
            refs = [s.ref for s in settlements]
            return self.settle_sent(
                worker,
                [s.id for s in settlements],
                [s.attempts for s in settlements],
                audit_code=audit_code,
                refs=refs if any(refs) else None,
                held=held,
                audit_successes=audit_successes,
                claimed_at=claimed_at,
                now=now,
            )
        kept = [s for s in settlements if s.status != SettleStatus.DELETED]
        gone = [s for s in settlements if s.status == SettleStatus.DELETED]
        rows = self._run(
            "outbox_settle",
            {
                "worker": worker,
                "now": now,
                "claimed_at": claimed_at,
                "held": held,
                "audit_successes": audit_successes,
                "pass_over_dead": pass_over_dead,
                "ids": bigint_array(s.id for s in kept),
                "attempts": bigint_array(s.attempts for s in kept),
                "statuses": text_array(s.status for s in kept),
                "delays": [s.delay_s for s in kept],
                "error_codes": text_array(s.error_code for s in kept),
                "errors": text_array(s.error for s in kept),
                "refs": text_array(s.ref for s in kept),
                "audit_codes": text_array(s.audit_code for s in kept),
                "refunds": [s.refund for s in kept],
                "delete_ids": bigint_array(s.id for s in gone),
                "delete_attempts": bigint_array(s.attempts for s in gone),
                "delete_audit_codes": text_array(s.audit_code for s in gone),
                "delete_error_codes": text_array(s.error_code for s in gone),
            },
        )
        if rows:
            self._note_contended(rows[0]["contended"])
        return {row["id"] for row in rows}

    def release_keys(self, keys: Sequence[str]) -> list[str]:
        """Let the next message of each key go if nothing before it holds the key (the release a settle
        makes); the keys a committing writer still holds come back. Run outside a transaction."""
        if not keys:
            return []
        params = {"keys": list(keys), "fast_commit": self.conn.autocommit}
        return list(self._run("outbox_release_keys_again", params)[0]["contended"] or [])

    def release_contended(self) -> list[str]:
        """``release_keys`` for the keys settles left in ``contended_keys``; those still held stay there."""
        if not self.contended_keys:
            return []
        still = self.release_keys(sorted(self.contended_keys))
        self.contended_keys = set(still)
        return still

    def renew(
        self, worker: str, held: Sequence[tuple[int, int]], lease_s: float, *, now: datetime | None = None
    ) -> set[int]:
        """Extend the leases of (id, attempts) pairs this worker holds; return the ids renewed."""
        if not held:
            return set()
        rows = self._run(
            "outbox_renew_leases",
            {
                "worker": worker,
                "lease_s": lease_s,
                "now": now,
                **_held_params(held),
            },
        )
        return {row["id"] for row in rows}

    def release_unsent(
        self, worker: str, held: Sequence[tuple[int, int]], reason: str, *, now: datetime | None = None
    ) -> set[int]:
        """Give claimed-but-unsent rows back (attempt not counted); return the ids released."""
        if not held:
            return set()
        rows = self._run(
            "outbox_release_unsent",
            {
                "worker": worker,
                "reason": reason,
                "now": now,
                **_held_params(held),
            },
        )
        return {row["id"] for row in rows}

    def dedup_lookup(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Row]:
        """Sent rows with the same (topic, payload_sha), keyed by that pair."""
        if not keys:
            return {}
        rows = self._run("outbox_dedup_lookup", {"topics": [k[0] for k in keys], "payload_shas": [k[1] for k in keys]})
        return {(row["topic"], row["payload_sha"]): row for row in rows}

    def next_due_in_s(self, *, paused_topics: Sequence[str] = (), now: datetime | None = None) -> float | None:
        """Seconds until the next pending row outside ``paused_topics`` is due (negative: overdue); None: none."""
        rows = self._run("outbox_next_due_in", {"now": now, "paused_topics": list(paused_topics)}, reuse_plan=True)
        return rows[0]["next_due_in_s"] if rows else None

    def retry_destination_failures_now(self, codes: Sequence[str], *, now: datetime | None = None) -> int:
        """Make messages waiting out a backoff for these error codes due now; how many."""
        return int(self._run("outbox_retry_destination_failures_now", {"codes": list(codes), "now": now})[0]["pulled"])


def _held_params(held: Sequence[tuple[int, int]]) -> dict[str, list[int]]:
    """(id, attempts) pairs a worker holds, as the fenced statements take them: two parallel arrays."""
    return {"ids": [row_id for row_id, _ in held], "attempts": [attempts for _, attempts in held]}
