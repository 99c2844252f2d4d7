"""``SharedTables``: the statements not bound to one outbox table (relay liveness, destination health,
alert memory, shared-table retention, the schema catalog) and the database's clock."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from outbox_pipelines.core.storage.queries import shared_query
from outbox_pipelines.core.storage.statements import Row, _execute, _fetch, _prepare


class SharedTables:
    """The statements not bound to one outbox table: relay liveness, destination health,
    alert memory, shared-table retention, the schema catalog, and the database's clock."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def _run(self, query: str, params: dict[str, Any]) -> list[Row]:
        return _fetch(self.conn, shared_query(query), params)

    def _count(self, query: str, params: dict[str, Any], *, reuse_plan: bool = False) -> int:
        """Rows the statement changed. ``reuse_plan``: as for ``OutboxTable``'s statements."""
        with _execute(self.conn, shared_query(query), params, _prepare(reuse_plan)) as cur:
            return cur.rowcount

    # -- the clock -----------------------------------------------------------
    def database_now(self) -> datetime:
        now: datetime = self._run("database_now", {})[0]["now"]
        return now

    def seconds_until(self, at: datetime, *, now: datetime | None = None) -> float:
        """How far ``at`` lies ahead of the database's clock (0 once it has passed)."""
        return float(self._run("database_seconds_until", {"at": at, "now": now})[0]["seconds"])

    # -- relay liveness (outbox_relay_workers) -------------------------------
    def register_relay(
        self,
        *,
        worker: str,
        table_name: str,
        run_id: str | None,
        pid: int,
        host: str,
        job: str | None = None,
        now: datetime | None = None,
    ) -> None:
        self._run(
            "outbox_relay_workers_register",
            {
                "worker": worker,
                "table_name": table_name,
                "run_id": run_id,
                "job": job,
                "pid": pid,
                "host": host,
                "now": now,
            },
        )

    def heartbeat_relay(self, worker: str, *, now: datetime | None = None) -> bool:
        """False if the relay is recorded as stopped (declared dead meanwhile)."""
        return self._count("outbox_relay_workers_heartbeat", {"worker": worker, "now": now}) > 0

    def record_relay_stop(self, worker: str, reason: str, *, now: datetime | None = None) -> bool:
        """False if its stop was already recorded."""
        return self._count("outbox_relay_workers_stop", {"worker": worker, "reason": reason, "now": now}) > 0

    def note_held_batch(self, worker: str, held_from: str, held_to: str, attempts: str) -> None:
        """claim = "auto": the batch this relay holds in its transaction, as runs of consecutive ids at one
        attempt count (``bigint_array`` literals of the runs' first ids, last ids and attempts)."""
        self._count(
            "outbox_relay_workers_note_held",
            {"worker": worker, "held_from": held_from, "held_to": held_to, "attempts": attempts},
            reuse_plan=True,  # once per batch: its plan is kept for the keeper's session
        )

    def held_batch(self, worker: str) -> Row | None:
        """The batch a relay last noted it held (``held_from``, ``held_to``, ``held_attempts``), if any."""
        rows = self._run("outbox_relay_workers_held", {"worker": worker})
        return rows[0] if rows else None

    def silent_relays(self, *, silent_after_s: float, now: datetime | None = None) -> list[Row]:
        """Relays not stopped whose last heartbeat is older than ``silent_after_s``."""
        return self._run("outbox_relay_workers_silent", {"silent_after_s": silent_after_s, "now": now})

    def relays_alive(self, tables: Sequence[str], *, within_s: float, now: datetime | None = None) -> dict[str, int]:
        """How many relays of each table heartbeat within ``within_s`` (tables with none are left out)."""
        rows = self._run("outbox_relay_workers_alive", {"tables": list(tables), "within_s": within_s, "now": now})
        return {row["table_name"]: int(row["alive"]) for row in rows}

    def relays_of_run(self, run_id: str) -> list[Row]:
        return self._run("outbox_relay_workers_by_run", {"run_id": run_id})

    # -- destination health (outbox_destination_health) ---------------------
    def destination_gate(self, table_name: str, *, now: datetime | None = None) -> Row | None:
        """The table's pause and circuit, with the database's ``now``; None if never recorded."""
        rows = self._run("outbox_destination_gate", {"table_name": table_name, "now": now})
        return rows[0] if rows else None

    def take_destination_probe(self, table_name: str, *, probe_interval_s: float, now: datetime | None = None) -> bool:
        """True if this relay may send the open circuit's next probe (the next one is then due later)."""
        return (
            self._count(
                "outbox_destination_take_probe",
                {"table_name": table_name, "probe_interval_s": probe_interval_s, "now": now},
            )
            > 0
        )

    def pause_destination(
        self, table_name: str, *, destination: str, delay_s: float, reason: str, now: datetime | None = None
    ) -> None:
        self._run(
            "outbox_destination_pause",
            {"table_name": table_name, "destination": destination, "delay_s": delay_s, "reason": reason, "now": now},
        )

    def record_destination_success(self, table_name: str, *, destination: str, now: datetime | None = None) -> bool:
        """End the failure streak and close the circuit; True once written (the row is upserted)."""
        return (
            self._count(
                "outbox_destination_health_success", {"table_name": table_name, "destination": destination, "now": now}
            )
            > 0
        )

    def record_destination_failures(
        self,
        table_name: str,
        *,
        destination: str,
        failures: int,
        codes: dict[str, int],
        error: str | None,
        threshold: int,
        probe_interval_s: float,
        now: datetime | None = None,
    ) -> bool:
        """Extend the failure streak by ``failures``; True if the circuit is open now."""
        rows = self._run(
            "outbox_destination_health_failure",
            {
                "table_name": table_name,
                "destination": destination,
                "failures": failures,
                "codes": Jsonb(codes),
                "error": error,
                "threshold": threshold,
                "probe_interval_s": probe_interval_s,
                "now": now,
            },
        )
        return bool(rows[0]["circuit_open"])

    def record_relay_problem(self, table_name: str, problem: str, *, now: datetime | None = None) -> None:
        self._run("outbox_relay_problem_record", {"table_name": table_name, "problem": problem, "now": now})

    def clear_relay_problem(self, table_name: str, *, now: datetime | None = None) -> bool:
        """True if a problem was recorded (the table relays again)."""
        return self._count("outbox_relay_problem_clear", {"table_name": table_name, "now": now}) > 0

    def record_paused_topics(self, table_name: str, paused: dict[str, str], *, now: datetime | None = None) -> None:
        """The topics the table's relay leaves paused now, each with who paused it (core/storage/paused_topics.py)."""
        self._run("outbox_paused_topics_record", {"table_name": table_name, "paused": Jsonb(paused), "now": now})

    def read_paused_topics(self, table_name: str) -> dict[str, dict[str, Any]]:
        """{topic: {"by", "since"}} as the table's relay last recorded them; {} when none did."""
        rows = self._run("outbox_paused_topics_read", {"table_name": table_name})
        return dict(rows[0]["paused_topics"]) if rows else {}

    def read_destination_health(self, table_name: str, *, now: datetime | None = None) -> Row | None:
        rows = self._run("outbox_destination_health_read", {"table_name": table_name, "now": now})
        return rows[0] if rows else None

    # -- alert memory (outbox_alert_state) -----------------------------------
    def read_alert_states(self, keys: Sequence[str]) -> list[Row]:
        return self._run("outbox_alert_state_read", {"keys": list(keys)})

    def write_alert_state(
        self,
        *,
        key: str,
        severity: str,
        started_at: datetime | None,
        notified_at: datetime | None,
        summary: str,
        now: datetime | None = None,
    ) -> None:
        self._run(
            "outbox_alert_state_write",
            {
                "alert_key": key,
                "severity": severity,
                "started_at": started_at,
                "notified_at": notified_at,
                "summary": summary,
                "now": now,
            },
        )

    # -- retention of the shared tables --------------------------------------
    def delete_old_audit_rows(
        self,
        *,
        retention_s: float,
        limit: int,
        kept: Sequence[int],
        after_id: int = 0,
        now: datetime | None = None,
    ) -> Row:
        """One batch: the next ``limit`` audit rows by id after ``after_id``, those older than ``retention_s``
        deleted but the ``kept`` ids; ``deleted``, ``seen``, ``old`` and ``last_id`` (shared.sql,
        outbox_audit_clean_old)."""
        params = {"retention_s": retention_s, "limit": limit, "after_id": after_id, "now": now, "kept": list(kept)}
        return self._run("outbox_audit_clean_old", params)[0]

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
