"""The engine's SQL, one method a named statement: ``OutboxTable`` for one outbox table,
``SharedTables`` for the tables and clock every outbox table shares.

This is the one engine module that names queries (sql/queries/*.sql). The
order wing's ledger keeps its own (ledger.sql), and the statements that run
before the schema exists are bootstrap.sql's, read by core/storage/db.py,
core/storage/migrate.py and dagster_home.py. ``now`` parameters exist for tests that
move database time; production passes None and every statement uses the
server's ``now()``.
"""

from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import RowMaker, dict_row, tuple_row
from psycopg.types.json import Jsonb

from outbox_pipelines.core.canonical import loads_jsonb_text
from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.names import table_identifier, validate_table_name
from outbox_pipelines.core.storage.queries import named_queries, shared_query, table_query

Row = dict[str, Any]
Statement = str | sql.SQL | sql.Composed


def unknown_table(table_name: str) -> UnknownTable:
    return UnknownTable(
        f"outbox table {table_name!r} does not exist: run 'outbox-pipelines db upgrade', "
        f"or 'outbox-pipelines db create-table {table_name}' for a new table"
    )


class NewRow(NamedTuple):
    """A message to insert, checked: payload and headers as canonical JSON text."""

    event_id: str
    tenant_id: str | None
    topic: str
    payload: str
    payload_sha: str
    headers: str
    available_at: datetime | None
    ordering_key: str | None = None


@dataclass(frozen=True)
class Settlement:
    """How one claimed row ends: new status ('sent', 'deleted', 'pending', 'dead')."""

    id: int
    attempts: int
    status: str
    audit_code: str
    delay_s: float = 0.0
    error_code: str | None = None
    error: str | None = None
    ref: str | None = None
    # Give back the attempt counted at claim (throttling, or the circuit was open): not the message's fault.
    refund: bool = False


# COPY's text format, written here: psycopg's write_row takes 2 µs a row, a tenth of a batch enqueue.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
# Text per COPY message: small enough that the server stores a batch while the rest of it is still
# being encoded (a batch of 1,000 messages of 300 bytes went 1.3x faster with 8 kB than in one piece).
_COPY_CHUNK_CHARS = 8_192


def _copy_line(row_id: int, row: NewRow) -> str:
    """One row of ``outbox_copy_in``: id, event_id, tenant_id, topic, payload, payload_sha, headers.

    JSON text holds no control character (it escapes them with a backslash), so the common row, with
    no backslash anywhere, printable identifiers and no tenant, needs no escaping at all."""
    event_id, tenant_id, topic, payload, payload_sha, headers, _, _ = row
    if (tenant_id is None and "\\" not in payload and "\\" not in headers and "\\" not in event_id
            and "\\" not in topic and event_id.isprintable() and topic.isprintable()):
        return f"{row_id}\t{event_id}\t\\N\t{topic}\t{payload}\t{payload_sha}\t{headers}\n"
    fields = [str(row_id), event_id, tenant_id, topic, payload, payload_sha, headers]
    return "\t".join("\\N" if field is None else field.translate(_COPY_ESCAPES) for field in fields) + "\n"


def bigint_array(values: Iterable[int]) -> str:
    """An array parameter as PostgreSQL's text literal: psycopg dumps a Python list element by element, which
    cost a relay as long as the settle statement on a batch of 1,000 (cast it: ``%(ids)s::bigint[]``)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _claimed_row(cursor: object) -> RowMaker[ClaimedMessage]:
    return _claimed_message


def _claimed_message(values: Sequence[Any]) -> ClaimedMessage:
    """A claim's row, whose ``body`` is the JSON array [payload, headers] as UTF-8 bytes: one decoding call
    per row, where psycopg's jsonb loader would make two, and two conversions of text more."""
    row_id, event_id, tenant_id, topic, body, payload_sha, attempts, created_at, claimed_at, ordering_key = values
    payload, headers = loads_jsonb_text(body)
    return ClaimedMessage.from_row((row_id, event_id, tenant_id, topic, payload, payload_sha, headers, attempts,
                                    created_at, claimed_at, ordering_key))


# Up to this many rows, a relay's statement keeps its plan (``reuse_plan``; why: core/relay/session.py).
PLAN_REUSE_MAX_ROWS = 16


def _execute(conn: psycopg.Connection, statement: Statement, params: dict[str, Any],
             prepare: bool | None = None) -> psycopg.Cursor[Row]:
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(statement, params, prepare=prepare)
    return cur


def _fetch(conn: psycopg.Connection, statement: Statement, params: dict[str, Any],
           prepare: bool | None = None) -> list[Row]:
    with _execute(conn, statement, params, prepare) as cur:
        return cur.fetchall() if cur.description else []


def _prepare(reuse_plan: bool) -> bool | None:
    """``reuse_plan``: prepare the statement now (its plan kept for the session; PostgreSQL may make it
    generic). Otherwise the connection's own rule (the relay's sessions: never prepared, planned anew)."""
    return True if reuse_plan else None


def ready_tables(conn: psycopg.Connection, paused_by_table: Mapping[str, Sequence[str]]) -> set[str]:
    """Which of these outbox tables have a pending row due now outside their paused topics: one statement
    for all of them (a relay group's poll for its quiet tables)."""
    if not paused_by_table:
        return set()
    parts = (_ready_probe(name, tuple(paused)) for name, paused in sorted(paused_by_table.items()))
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("\nUNION ALL\n".join(parts))  # each part composed by psycopg.sql from validated names
        return {row[0] for row in cur.fetchall()}


@lru_cache(maxsize=4096)
def _ready_probe(table_name: str, paused: tuple[str, ...]) -> str:
    """One table's part of ready_tables, rendered once (a group polls its quiet tables every second)."""
    probe = sql.SQL(named_queries()["outbox_ready_probe"]).format(
        table=table_identifier(validate_table_name(table_name)), name=sql.Literal(table_name),
        paused=sql.Literal(list(paused)))
    return probe.as_string(None)


class OutboxTable:
    """Enqueue into, claim, settle and maintain one outbox table through one psycopg connection.

    The table's name is validated here, where it enters the engine; the statements
    below quote it as an identifier and do not check it again.
    """

    def __init__(self, conn: psycopg.Connection, table_name: str) -> None:
        self.conn = conn
        self.table_name = validate_table_name(table_name)
        # Ordering keys a settle could not release because a writer was committing a message of the key
        # (migration 0010): the relay releases them again once its own transaction is over.
        self.contended_keys: set[str] = set()

    def _note_contended(self, keys: Sequence[str] | None) -> None:
        if keys:
            self.contended_keys.update(keys)

    def _run(self, query: str, params: dict[str, Any], *, reuse_plan: bool = False) -> list[Row]:
        try:
            return _fetch(self.conn, table_query(query, self.table_name), {"table_name": self.table_name, **params},
                          _prepare(reuse_plan))
        except psycopg.errors.UndefinedTable:
            raise unknown_table(self.table_name) from None

    def _claimed(self, query: str, params: dict[str, Any], reuse_plan: bool) -> list[ClaimedMessage]:
        """A claim's rows built straight into ClaimedMessage (columns in its field order): no dict per row."""
        statement = table_query(query, self.table_name)
        try:
            # Binary results: the timestamps cross as integers, not text to format and parse.
            with self.conn.cursor(row_factory=_claimed_row, binary=True) as cur:
                cur.execute(statement, {"table_name": self.table_name, **params}, prepare=_prepare(reuse_plan))
                return cur.fetchall()
        except psycopg.errors.UndefinedTable:
            raise unknown_table(self.table_name) from None

    def _run_shared(self, query: str, params: dict[str, Any]) -> list[Row]:
        """A statement of the shared tables about this table (its lock, its audit rows)."""
        return _fetch(self.conn, shared_query(query), {"table_name": self.table_name, **params})

    # -- enqueue -------------------------------------------------------------
    def insert(self, *, event_id: str, tenant_id: str | None, topic: str, payload: str, payload_sha: str,
               headers: str, available_at: datetime | None, ordering_key: str | None = None,
               now: datetime | None = None) -> int | None:
        """Insert one message (payload and headers as canonical JSON text); None if its event_id exists."""
        # A plain cursor, not _run's dict rows: this runs inside the application's own transaction,
        # once per message, where the client's few microseconds are what an enqueue adds to it.
        params = {"event_id": event_id, "tenant_id": tenant_id, "topic": topic, "payload": payload,
                  "payload_sha": payload_sha, "headers": headers, "available_at": available_at, "now": now}
        query = "outbox_insert"
        if ordering_key is not None:  # the unordered statement stays as it was: ordering costs it nothing
            query, params["ordering_key"] = "outbox_insert_keyed", ordering_key
        try:
            with self.conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(table_query(query, self.table_name), params)
                row = cur.fetchone()
        except psycopg.errors.UndefinedTable:
            raise unknown_table(self.table_name) from None
        return int(row[0]) if row else None

    def insert_many(self, *, event_ids: Sequence[str], tenant_ids: Sequence[str | None], topics: Sequence[str],
                    payloads: Sequence[str], payload_shas: Sequence[str], headers: Sequence[str],
                    available_ats: Sequence[datetime | None], ordering_keys: Sequence[str | None] = (),
                    now: datetime | None = None) -> dict[str, int]:
        """Insert the messages (columns as parallel lists) in one statement; the new ids by event_id."""
        params: dict[str, Any] = {
            "event_ids": list(event_ids), "tenant_ids": list(tenant_ids), "topics": list(topics),
            "payloads": list(payloads), "payload_shas": list(payload_shas), "headers": list(headers),
            "available_ats": list(available_ats), "now": now}
        keyed = any(key is not None for key in ordering_keys)
        if keyed:
            params["ordering_keys"] = list(ordering_keys)
        rows = self._run("outbox_insert_many_keyed" if keyed else "outbox_insert_many", params)
        return {row["event_id"]: int(row["id"]) for row in rows}

    def copy_new(self, rows: Iterable[NewRow], count: int) -> list[int] | None:
        """COPY ``count`` new messages in (due now: available_at is not written), under a savepoint; their
        ids in the rows' order, or None, having written nothing, when an event_id is already stored.

        ``rows`` is read as the COPY goes, a chunk at a time: the server stores one chunk while the next
        is made. An exception from it stops the COPY, undoes what was sent, and goes to the caller.

        On an autocommit connection outside a transaction the batch gets one of its own (all or
        nothing); otherwise it joins the caller's, which an idle connection outside autocommit opens.
        """
        conn = self.conn
        own_transaction = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        with conn.transaction() if own_transaction else nullcontext():
            return self._copy_in_savepoint(rows, count)

    def _copy_in_savepoint(self, rows: Iterable[NewRow], count: int) -> list[int] | None:
        try:
            # Client-side binding: the savepoint and the id reservation cross as one message.
            with psycopg.ClientCursor(self.conn, row_factory=tuple_row) as opening:
                opening.execute(table_query("outbox_copy_open", self.table_name),
                                {"table_name": self.table_name, "count": count})
                opening.nextset()
                ids_text = opening.fetchone()[0]  # type: ignore[index]
            ids = [int(row_id) for row_id in ids_text[1:-1].split(",")]
            with self.conn.cursor() as cur, cur.copy(table_query("outbox_copy_in", self.table_name)) as copy:
                lines, size = [], 0
                for row_id, row in zip(ids, rows, strict=True):
                    line = _copy_line(row_id, row)
                    lines.append(line)
                    size += len(line)
                    if size >= _COPY_CHUNK_CHARS:
                        copy.write("".join(lines))
                        lines, size = [], 0
                copy.write("".join(lines))
        except BaseException as exc:
            self._undo_copy()  # whatever stopped the COPY, nothing of it stays
            if isinstance(exc, psycopg.errors.UniqueViolation):
                return None
            if isinstance(exc, psycopg.errors.UndefinedTable):
                raise unknown_table(self.table_name) from None
            raise
        self.conn.execute(table_query("outbox_copy_release", self.table_name))
        return ids

    def _undo_copy(self) -> None:
        """Back to before ``outbox_copy_open``: the caller's transaction goes on. Where the savepoint was
        never made (the transaction had failed before, the connection is gone) this fails too, and the
        error that brought us here is the one to report."""
        with suppress(psycopg.Error):
            self.conn.execute(table_query("outbox_copy_undo", self.table_name))

    def find_by_event_ids(self, event_ids: Sequence[str]) -> dict[str, tuple[int, str]]:
        """(id, payload_sha) of the stored rows with these event ids, by event_id."""
        rows = self._run("outbox_find_by_event_ids", {"event_ids": list(event_ids)})
        return {row["event_id"]: (int(row["id"]), row["payload_sha"]) for row in rows}

    # -- the relay's cycle ---------------------------------------------------
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
        now: datetime | None = None,
    ) -> list[ClaimedMessage]:
        """Due pending rows, and sending rows whose lease expired (re-taken, fenced by the attempt number).

        ``fast_commit``: on an autocommit connection, the claim commits without waiting for the WAL
        flush (the relay's; a lost claim means a redelivery). Inside a caller's transaction it would
        make the whole transaction so: leave it False there. ``gated``: nothing unless the table's
        destination is plainly open (not paused, no throttle probe due, circuit closed).
        ``reuse_plan``: a few rows are expected; keep the statement's plan (relay/session.py).
        """
        return self._claimed(
            "outbox_claim",
            {"worker": worker, "limit": limit, "lease_s": lease_s, "paused_topics": list(paused_topics),
             "max_attempts": max_attempts, "audit_claims": audit_claims, "fast_commit": fast_commit,
             "gated": gated, "now": now},
            reuse_plan,
        )

    def claim_held(self, limit: int, hold_s: float, *, paused_topics: Sequence[str] = (), gated: bool = False,
                   reuse_plan: bool = False, now: datetime | None = None) -> list[ClaimedMessage]:
        """Due pending rows locked in the open transaction (claim = "transaction"); ``settle(held=True)``
        in the same transaction ends them. The server ends a transaction left idle for ``hold_s``.
        ``gated``, ``reuse_plan``: as for ``claim``."""
        return self._claimed("outbox_claim_held", {"limit": limit, "paused_topics": list(paused_topics),
                                                   "hold_timeout_ms": max(int(hold_s * 1000), 1), "gated": gated,
                                                   "now": now}, reuse_plan)

    def settle_sent(self, worker: str, ids: Sequence[int], attempts: Sequence[int], *, audit_code: str,
                    refs: Sequence[str | None] | None = None, held: bool = False, audit_successes: bool = True,
                    fast_commit: bool = False, pass_over_dead: bool = False,
                    now: datetime | None = None) -> set[int]:
        """Mark delivered rows sent (their attempts: the ones claimed): ``settle`` for the common batch with
        nothing else to record. Returns the ids settled; the others lost their lease (audited).

        ``fast_commit`` (leased rows, autocommit connection): as for ``claim``, the settle commits without
        waiting for the WAL flush; inside a caller's transaction it would make the whole transaction so.
        """
        params = {"worker": worker, "now": now, "audit_successes": audit_successes, "audit_code": audit_code,
                  "ids": bigint_array(ids), "refs": list(refs) if refs is not None else None}
        # A few rows: the statement's plan is kept (relay/session.py); a big batch is planned for its size.
        reuse_plan = len(ids) <= PLAN_REUSE_MAX_ROWS
        if held:  # locked since the claim in this transaction: nothing to check, the attempt is counted now
            rows = self._run("outbox_settle_held_sent", params, reuse_plan=reuse_plan)
        else:
            rows = self._run("outbox_settle_sent", {**params, "attempts": bigint_array(attempts),
                                                    "fast_commit": fast_commit}, reuse_plan=reuse_plan)
        self._note_contended(rows[0]["contended"])
        lost = rows[0]["lost"]
        return set(ids).difference(lost) if lost else set(ids)

    def settle(self, worker: str, settlements: Sequence[Settlement], *, held: bool = False,
               audit_successes: bool = True, pass_over_dead: bool = False, now: datetime | None = None) -> set[int]:
        """Apply the outcomes; return the ids settled. Missing ids lost their lease (audited).

        ``held``: the rows were claimed with ``claim_held`` in this transaction (their attempt is
        counted now). ``audit_successes`` False: deliveries leave no audit row (audit = "failures").
        ``pass_over_dead``: a keyed message that dies lets the rest of its key go (ordering = "skip").
        Settled keyed messages release their keys; keys a committing writer held are kept in
        ``contended_keys``, for ``release_contended`` once the caller's transaction is over.
        """
        if not settlements:
            return set()
        audit_code = settlements[0].audit_code
        if all(s.status == "sent" and s.error is None and s.error_code is None and not s.refund
               and s.audit_code == audit_code for s in settlements):
            refs = [s.ref for s in settlements]
            return self.settle_sent(worker, [s.id for s in settlements], [s.attempts for s in settlements],
                                    audit_code=audit_code, refs=refs if any(refs) else None, held=held,
                                    audit_successes=audit_successes, now=now)
        kept = [s for s in settlements if s.status != "deleted"]
        gone = [s for s in settlements if s.status == "deleted"]
        rows = self._run(
            "outbox_settle",
            {
                "worker": worker,
                "now": now,
                "held": held,
                "audit_successes": audit_successes,
                "pass_over_dead": pass_over_dead,
                "ids": [s.id for s in kept],
                "attempts": [s.attempts for s in kept],
                "statuses": [s.status for s in kept],
                "delays": [s.delay_s for s in kept],
                "error_codes": [s.error_code for s in kept],
                "errors": [s.error for s in kept],
                "refs": [s.ref for s in kept],
                "audit_codes": [s.audit_code for s in kept],
                "refunds": [s.refund for s in kept],
                "delete_ids": [s.id for s in gone],
                "delete_attempts": [s.attempts for s in gone],
                "delete_audit_codes": [s.audit_code for s in gone],
                "delete_error_codes": [s.error_code for s in gone],
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
        return list(self._run("outbox_release_keys_again", {"keys": list(keys)})[0]["contended"] or [])

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
                "ids": [h[0] for h in held],
                "attempts": [h[1] for h in held],
            },
        )
        return {row["id"] for row in rows}

    def release_unsent(self, worker: str, held: Sequence[tuple[int, int]], reason: str, *,
                       now: datetime | None = None) -> set[int]:
        """Give claimed-but-unsent rows back (attempt not counted); return the ids released."""
        if not held:
            return set()
        rows = self._run("outbox_release_unsent", {"worker": worker, "reason": reason, "now": now,
                                                   "ids": [h[0] for h in held], "attempts": [h[1] for h in held]})
        return {row["id"] for row in rows}

    def dedup_lookup(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Row]:
        """Sent rows with the same (topic, payload_sha), keyed by that pair."""
        if not keys:
            return {}
        rows = self._run(
            "outbox_dedup_lookup", {"topics": [k[0] for k in keys], "payload_shas": [k[1] for k in keys]}
        )
        return {(row["topic"], row["payload_sha"]): row for row in rows}

    def next_due_in_s(self, *, paused_topics: Sequence[str] = (), now: datetime | None = None) -> float | None:
        """Seconds until the next pending row outside ``paused_topics`` is due (negative: overdue); None: none."""
        rows = self._run("outbox_next_due_in", {"now": now, "paused_topics": list(paused_topics)}, reuse_plan=True)
        return rows[0]["next_due_in_s"] if rows else None

    def retry_destination_failures_now(self, codes: Sequence[str], *, now: datetime | None = None) -> int:
        """Make messages waiting out a backoff for these error codes due now; how many."""
        return int(self._run("outbox_retry_destination_failures_now",
                             {"codes": list(codes), "now": now})[0]["pulled"])

    # -- the relay's single-active lock and its own audit rows ---------------
    def try_relay_lock(self) -> bool:
        """Take the table's single-active session lock if nobody holds it."""
        rows = self._run_shared("outbox_relay_try_lock", {})
        return bool(rows and rows[0]["locked"])

    def wait_for_relay_lock(self, timeout_ms: int) -> bool:
        """Block up to ``timeout_ms`` on the single-active lock; True once held. Sets the session's
        lock_timeout: follow with ``reset_lock_timeout`` (in a ``finally``)."""
        try:
            self._run_shared("outbox_relay_wait_lock", {"timeout_ms": str(max(int(timeout_ms), 1))})
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    def reset_lock_timeout(self) -> None:
        """Let this session wait for locks as long as it needs again (after ``wait_for_relay_lock``)."""
        self._run_shared("outbox_relay_lock_timeout_reset", {})

    def release_relay_lock(self) -> bool:
        """Let go of the single-active lock; False if this session did not hold it."""
        rows = self._run_shared("outbox_relay_unlock", {})
        return bool(rows and rows[0]["unlocked"])

    def audit_messages(self, ids: Sequence[int], *, code: str, error_code: str | None, worker: str,
                       detail: str | None) -> None:
        """One audit row per message id; with no ids, one row about the table (message_id NULL)."""
        self._run_shared("outbox_audit_insert", {"ids": list(ids) or [None], "code": code,
                                                 "error_code": error_code, "worker": worker, "detail": detail})

    def audit_note(self, *, code: str, worker: str, detail: str) -> None:
        """An audit row about the table as a whole (a backfill, say)."""
        self._run_shared("outbox_audit_note", {"code": code, "worker": worker, "detail": detail})

    # -- maintenance ---------------------------------------------------------
    def requeue_stuck(
        self,
        worker: str,
        *,
        stuck_after_s: float,
        max_attempts: int,
        limit: int = 1000,
        dead_holder: str | None = None,
        pass_over_dead: bool = False,
        now: datetime | None = None,
    ) -> list[Row]:
        """Return expired or stuck leases to pending (dead when out of attempts); ``dead_holder``
        also returns every row that relay holds, lease or not (it is known to be dead).
        ``pass_over_dead``: as for ``settle``."""
        rows = self._run(
            "outbox_requeue_stuck",
            {
                "worker": worker,
                "dead_holder": dead_holder,
                "stuck_after_s": stuck_after_s,
                "max_attempts": max_attempts,
                "limit": limit,
                "pass_over_dead": pass_over_dead,
                "now": now,
            },
        )
        if rows:
            self._note_contended(rows[0]["contended"])
        return rows

    def skip_dead_heads(self, worker: str, *, ids: Sequence[int] | None, ordering_key: str | None, reason: str,
                        dry_run: bool, limit: int, now: datetime | None = None) -> list[Row]:
        """Pass over parked dead messages (by id, or every one of a key): their keys' later messages go on."""
        rows = self._run("outbox_skip_dead_heads", {
            "worker": worker, "ids": list(ids) if ids is not None else None, "ordering_key": ordering_key,
            "reason": reason, "dry_run": dry_run, "limit": limit, "now": now})
        if rows:
            self._note_contended(rows[0]["contended"])
        return rows

    def unblock_sweep(self, *, after_key: str, limit: int) -> Row:
        """One page of the ordering sweep (sql: outbox_unblock_sweep): last_key (None at the end), released."""
        row = self._run("outbox_unblock_sweep", {"after_key": after_key, "limit": limit})[0]
        self._note_contended(row["contended"])
        return row

    def clean_sent(self, worker: str, *, retention_s: float, limit: int, tenant_id: str | None = None,
                   now: datetime | None = None) -> int:
        rows = self._run("outbox_clean_sent", {"worker": worker, "retention_s": retention_s, "limit": limit,
                                               "tenant_id": tenant_id, "now": now})
        return int(rows[0]["deleted"]) if rows else 0

    def replay_dead(
        self,
        worker: str,
        *,
        after_id: int,
        ids: Sequence[int] | None,
        topic: str | None,
        tenant_id: str | None,
        error_code: str | None,
        since: datetime | None,
        until: datetime | None,
        force: bool,
        dry_run: bool,
        limit: int,
        now: datetime | None = None,
    ) -> list[Row]:
        """One page (ids above ``after_id``) of dead rows matching the filters (None = any), replayed
        unless ``dry_run``; BAD_REQUEST rows are refused unless ``force``."""
        return self._run("outbox_replay_dead", {
            "worker": worker, "after_id": after_id, "ids": list(ids) if ids is not None else None, "topic": topic,
            "tenant_id": tenant_id, "error_code": error_code, "since": since, "until": until, "force": force,
            "dry_run": dry_run, "limit": limit, "now": now})

    def sent_in_window(self, *, start: datetime, end: datetime, after_id: int, limit: int) -> list[ClaimedMessage]:
        """One page (ids above ``after_id``) of the rows sent in [start, end), as messages to deliver again."""
        rows = self._run("outbox_sent_in_window", {"start": start, "end": end, "after_id": after_id,
                                                   "limit": limit})
        return [ClaimedMessage(**row) for row in rows]

    # -- what operators read -------------------------------------------------
    def health_snapshot(self, *, stuck_after_s: float, window_s: float, sample: int,
                        now: datetime | None = None) -> Row:
        """What the checks read, at a cost bounded by ``sample`` however many sent rows are kept."""
        return self._run("outbox_health_snapshot", {"stuck_after_s": stuck_after_s, "window_s": window_s,
                                                    "sample": sample, "now": now})[0]

    def sent_count(self) -> int:
        """The exact number of sent rows kept (a full scan of them)."""
        return int(self._run("outbox_status_sent_count", {})[0]["n"])

    def dead_counts_by_code(self) -> dict[str, int]:
        """Dead rows per error code ('UNKNOWN' for none), the commonest first."""
        return {row["error_code"]: int(row["n"]) for row in self._run("outbox_status_dead_by_code", {})}

    def ready_count(self, paused_topics: Sequence[str] = (), *, now: datetime | None = None) -> int:
        """Pending rows due now, outside the paused topics."""
        return int(self._run("outbox_ready_count", {"paused_topics": list(paused_topics), "now": now})[0]["ready"])

    def held_by(self, worker: str) -> int:
        """How many rows ``worker`` holds in sending."""
        return int(self._run("outbox_held_by", {"worker": worker})[0]["held"])


class SharedTables:
    """The statements not bound to one outbox table: relay liveness, destination health,
    alert memory, shared-table retention, the schema catalog, and the database's clock."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def _run(self, query: str, params: dict[str, Any]) -> list[Row]:
        return _fetch(self.conn, shared_query(query), params)

    def _count(self, query: str, params: dict[str, Any]) -> int:
        """Rows the statement changed."""
        with _execute(self.conn, shared_query(query), params) as cur:
            return cur.rowcount

    # -- the clock -----------------------------------------------------------
    def database_now(self) -> datetime:
        now: datetime = self._run("database_now", {})[0]["now"]
        return now

    def seconds_until(self, at: datetime, *, now: datetime | None = None) -> float:
        """How far ``at`` lies ahead of the database's clock (0 once it has passed)."""
        return float(self._run("database_seconds_until", {"at": at, "now": now})[0]["seconds"])

    # -- relay liveness (outbox_relay_workers) -------------------------------
    def register_relay(self, *, worker: str, table_name: str, run_id: str | None, pid: int, host: str,
                       job: str | None = None, now: datetime | None = None) -> None:
        self._run("outbox_relay_workers_register", {"worker": worker, "table_name": table_name, "run_id": run_id,
                                                     "job": job, "pid": pid, "host": host, "now": now})

    def heartbeat_relay(self, worker: str, *, now: datetime | None = None) -> bool:
        """False if the relay is recorded as stopped (declared dead meanwhile)."""
        return self._count("outbox_relay_workers_heartbeat", {"worker": worker, "now": now}) > 0

    def record_relay_stop(self, worker: str, reason: str, *, now: datetime | None = None) -> bool:
        """False if its stop was already recorded."""
        return self._count("outbox_relay_workers_stop", {"worker": worker, "reason": reason, "now": now}) > 0

    def silent_relays(self, *, silent_after_s: float, now: datetime | None = None) -> list[Row]:
        """Relays not stopped whose last heartbeat is older than ``silent_after_s``."""
        return self._run("outbox_relay_workers_silent", {"silent_after_s": silent_after_s, "now": now})

    def relays_of_run(self, run_id: str) -> list[Row]:
        return self._run("outbox_relay_workers_by_run", {"run_id": run_id})

    # -- destination health (outbox_destination_health) ---------------------
    def destination_gate(self, table_name: str, *, now: datetime | None = None) -> Row | None:
        """The table's pause and circuit, with the database's ``now``; None if never recorded."""
        rows = self._run("outbox_destination_gate", {"table_name": table_name, "now": now})
        return rows[0] if rows else None

    def take_destination_probe(self, table_name: str, *, probe_interval_s: float,
                               now: datetime | None = None) -> bool:
        """True if this relay may send the open circuit's next probe (the next one is then due later)."""
        return self._count("outbox_destination_take_probe",
                           {"table_name": table_name, "probe_interval_s": probe_interval_s, "now": now}) > 0

    def pause_destination(self, table_name: str, *, destination: str, delay_s: float, reason: str,
                          now: datetime | None = None) -> None:
        self._run("outbox_destination_pause", {"table_name": table_name, "destination": destination,
                                               "delay_s": delay_s, "reason": reason, "now": now})

    def record_destination_success(self, table_name: str, *, destination: str, now: datetime | None = None) -> bool:
        """End the failure streak and close the circuit; True once written (the row is upserted)."""
        return self._count("outbox_destination_health_success",
                           {"table_name": table_name, "destination": destination, "now": now}) > 0

    def record_destination_failures(self, table_name: str, *, destination: str, failures: int,
                                    codes: dict[str, int], error: str | None, threshold: int,
                                    probe_interval_s: float, now: datetime | None = None) -> bool:
        """Extend the failure streak by ``failures``; True if the circuit is open now."""
        rows = self._run("outbox_destination_health_failure", {
            "table_name": table_name, "destination": destination, "failures": failures, "codes": Jsonb(codes),
            "error": error, "threshold": threshold, "probe_interval_s": probe_interval_s, "now": now})
        return bool(rows[0]["circuit_open"])

    def record_relay_problem(self, table_name: str, problem: str, *, now: datetime | None = None) -> None:
        self._run("outbox_relay_problem_record", {"table_name": table_name, "problem": problem, "now": now})

    def clear_relay_problem(self, table_name: str, *, now: datetime | None = None) -> bool:
        """True if a problem was recorded (the table relays again)."""
        return self._count("outbox_relay_problem_clear", {"table_name": table_name, "now": now}) > 0

    def read_destination_health(self, table_name: str, *, now: datetime | None = None) -> Row | None:
        rows = self._run("outbox_destination_health_read", {"table_name": table_name, "now": now})
        return rows[0] if rows else None

    # -- alert memory (outbox_alert_state) -----------------------------------
    def read_alert_states(self, keys: Sequence[str]) -> list[Row]:
        return self._run("outbox_alert_state_read", {"keys": list(keys)})

    def write_alert_state(self, *, key: str, severity: str, started_at: datetime | None,
                          notified_at: datetime | None, summary: str, now: datetime | None = None) -> None:
        self._run("outbox_alert_state_write", {"alert_key": key, "severity": severity, "started_at": started_at,
                                               "notified_at": notified_at, "summary": summary, "now": now})

    # -- retention of the shared tables --------------------------------------
    def delete_expired_ledger_rows(self, *, limit: int, now: datetime | None = None) -> int:
        """One batch of idempotency-ledger rows past their expiry; how many went."""
        return self._count("idempo_ledger_clean_expired", {"limit": limit, "now": now})

    def delete_old_audit_rows(self, *, retention_s: float, limit: int, now: datetime | None = None) -> int:
        """One batch of audit rows older than ``retention_s``; how many went."""
        return self._count("outbox_audit_clean_old", {"retention_s": retention_s, "limit": limit, "now": now})

    # -- the schema ------------------------------------------------------------
    def outbox_table_names(self) -> list[str]:
        """Tables of the current schema that carry the outbox's notify trigger."""
        return [row["table_name"] for row in self._run("outbox_tables_list", {})]

    def find_relation(self, table_name: str) -> Row | None:
        """What already bears the name ``table_name`` here, if anything: kind, schema, columns."""
        rows = self._run("pg_class_find_relation", {"table_name": table_name})
        return rows[0] if rows else None

    def create_outbox_table(self, table_name: str, *, dedup_index: bool) -> None:
        """Create the table of the canonical shape, or check the indexes and trigger of the one that exists.

        The SQL function refuses a name that is not a plain identifier; the reserved names are
        the caller's to refuse (core/storage/schema.py, where the name comes in).
        """
        self._run("outbox_table_create", {"table_name": table_name, "dedup_index": dedup_index})
