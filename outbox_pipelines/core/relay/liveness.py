"""Relay liveness: every relay heartbeats in ``outbox_relay_workers``; one that falls silent died.

A relay registers, heartbeats from its lease keeper and records why it stopped. One silent without a goodbye
(SIGKILL, OOM, a lost host) is presumed dead and buried: its rows go back to pending at once and on-call hears of it
(docs/explanation/on-call.md).
"""

import logging
import os
import socket
from dataclasses import dataclass, replace
from datetime import datetime

import psycopg

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.errors import UnknownTable
from outbox_pipelines.core.models import MessageState
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables

log = logging.getLogger("outbox_pipelines.liveness")

HEARTBEAT_EVERY_S = 5.0
# Silent this long, and its process is gone (same host), or silent for REMOTE_SILENT_AFTER_S
# (another host, whose processes cannot be looked at): the relay is dead.
SILENT_AFTER_S = 20.0
REMOTE_SILENT_AFTER_S = 60.0
HOST = socket.gethostname()


def register(
    conn: psycopg.Connection,
    worker: str,
    table_name: str,
    run_id: str | None,
    *,
    job: str | None = None,
    now: datetime | None = None,
) -> None:
    SharedTables(conn).register_relay(
        worker=worker, table_name=table_name, run_id=run_id, pid=os.getpid(), host=HOST, job=job, now=now
    )


def heartbeat(conn: psycopg.Connection, worker: str, *, now: datetime | None = None) -> bool:
    """Beat; False if this relay was declared dead meanwhile (it must stop claiming)."""
    return SharedTables(conn).heartbeat_relay(worker, now=now)


def stopped(conn: psycopg.Connection, worker: str, reason: str, *, now: datetime | None = None) -> bool:
    """Record the stop; False if it was already recorded (by the relay, or by another sweep)."""
    return SharedTables(conn).record_relay_stop(worker, reason[:500], now=now)


@dataclass(frozen=True)
class DeadRelay:
    worker: str
    table: str
    run_id: str | None
    job: str | None
    pid: int | None
    host: str | None
    started_at: datetime
    ran_s: float
    silent_s: float
    held: int = 0
    returned: int = 0

    def describe(self) -> str:
        where = f"pid {self.pid} on {self.host}" if self.pid else self.worker
        return (
            f"relay {self.worker} of {self.table} ({where}) stopped heartbeating {duration_words(self.silent_s)} ago "
            f"after running {duration_words(self.ran_s)}; it held {self.held} message{'s' if self.held != 1 else ''}, "
            f"{self.returned} returned to pending"
        )


def _process_gone(pid: int | None) -> bool:
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def find_dead(
    conn: psycopg.Connection,
    *,
    now: datetime | None = None,
    silent_after_s: float = SILENT_AFTER_S,
    remote_silent_after_s: float = REMOTE_SILENT_AFTER_S,
) -> list[DeadRelay]:
    """Relays that stopped heartbeating and whose process is gone (or, on another host, silent long enough)."""
    dead = []
    for row in SharedTables(conn).silent_relays(silent_after_s=silent_after_s, now=now):
        local = row["host"] == HOST
        if local and not _process_gone(row["pid"]):
            continue  # alive but slow to beat (a database blip): not dead
        if not local and row["silent_s"] < remote_silent_after_s:
            continue
        dead.append(
            DeadRelay(
                row["worker"],
                row["table_name"],
                row["run_id"],
                row["job"],
                row["pid"],
                row["host"],
                row["started_at"],
                row["ran_s"] or 0.0,
                row["silent_s"],
            )
        )
    return dead


def bury(conn: psycopg.Connection, relay: DeadRelay, max_attempts: int) -> DeadRelay | None:
    """Record the dead relay's end and return its rows to pending (dead when out of attempts).

    None if somebody else (another sweep, the relay itself) recorded its end first: then
    they tell on-call, not us.
    """
    if not stopped(conn, relay.worker, f"presumed dead: no heartbeat for {duration_words(relay.silent_s)}"):
        return None
    outbox_table = OutboxTable(conn, relay.table)
    held = returned = 0
    try:
        held = outbox_table.held_by(relay.worker)
        while True:
            rows = outbox_table.requeue_stuck(
                "liveness", stuck_after_s=10 * 365 * 86400.0, max_attempts=max_attempts, dead_holder=relay.worker
            )
            # Only this relay's rows that went back to pending (others' expired leases ride along).
            returned += sum(
                1 for r in rows if r["status"] == MessageState.PENDING and r["previous_holder"] == relay.worker
            )
            if len(rows) < 1000:
                break
        # claim = "auto": the batch it held unwritten in its transaction, if it died with one.
        noted = SharedTables(conn).held_batch(relay.worker)
        if noted is not None:
            rows = outbox_table.count_died_holding(
                "liveness",
                relay.worker,
                noted["held_from"],
                noted["held_to"],
                noted["held_attempts"],
                max_attempts=max_attempts,
            )
            held += len(rows)
            returned += sum(1 for r in rows if r["status"] == MessageState.PENDING)
    except UnknownTable:
        pass  # the table is gone: nothing to return
    log.warning("relay %s of %s presumed dead; %d held rows returned", relay.worker, relay.table, returned)
    return replace(relay, held=held, returned=returned)


def bury_relays_of_failed_run(
    conn: psycopg.Connection, run_id: str, max_attempts_of: dict[str, int]
) -> list[DeadRelay]:
    """A run its orchestrator declared failed: its relays that never said goodbye died with it.

    Buried at once (their rows return now, not after their lease), unless a relay's process is
    still alive on this host.
    """
    buried = []
    for row in SharedTables(conn).relays_of_run(run_id):
        if row["stopped_at"] is not None or (row["host"] == HOST and not _process_gone(row["pid"])):
            continue
        now = row["heartbeat_at"]
        relay = DeadRelay(
            row["worker"],
            row["table_name"],
            run_id,
            row["job"],
            row["pid"],
            row["host"],
            row["started_at"],
            (now - row["started_at"]).total_seconds(),
            0.0,
        )
        done = bury(conn, relay, max_attempts_of.get(relay.table, 1_000_000))
        if done is not None:
            buried.append(done)
    return buried
