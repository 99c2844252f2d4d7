"""What keeps ``db upgrade`` from hurting the application that shares the database (core/storage/migrate.py).

PostgreSQL 14 to 18 only (``SUPPORTED``); no upgrade through a transaction pooler unless
OUTBOX_DIRECT_DATABASE_URL is set; each migration under a short ``lock_timeout``, retried once what held it ends.
Why: docs/explanation/storage.md, "Upgrading beside the application".
"""

import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage import pooler
from outbox_pipelines.core.storage.lock_blockers import Blocker, BlockerWatch, describe
from outbox_pipelines.core.storage.queries import shared_query

SUPPORTED = (14, 18)  # the oldest and newest PostgreSQL majors CI runs on
LOCK_TIMEOUT_ENV = "OUTBOX_MIGRATION_LOCK_TIMEOUT_MS"
LOCK_TIMEOUT_S = 0.5  # a writer queued behind a DDL statement waits at most this
# Backoff between tries of a migration that met a lock: 0.5 s doubling to 10 s, for up to about 10 minutes.
FIRST_BACKOFF_S, MAX_BACKOFF_S, GIVE_UP_AFTER_S = 0.5, 10.0, 600.0


@dataclass(frozen=True)
class LockWaits:
    """How a migration waits for its locks: ``lock_timeout_s`` at a time, then backs off; gives up after
    ``give_up_after_s`` in all. ``said`` hears each retry (the CLI prints it)."""

    lock_timeout_s: float = LOCK_TIMEOUT_S
    give_up_after_s: float = GIVE_UP_AFTER_S
    said: Callable[[str], None] | None = None

    @classmethod
    def from_env(cls, said: Callable[[str], None] | None = None) -> "LockWaits":
        raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
        try:
            timeout_s = int(raw) / 1000 if raw else LOCK_TIMEOUT_S
        except ValueError:
            raise MigrationError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of milliseconds") from None
        if timeout_s <= 0:
            raise MigrationError(f"{LOCK_TIMEOUT_ENV} must be more than 0 (milliseconds)")
        return cls(lock_timeout_s=timeout_s, said=said)

    def for_concurrent(self) -> "LockWaits":
        """A concurrent index build or drop waits for the transactions older than it while the application's
        writes go on (its lock conflicts with no write): it may wait as long as the whole upgrade would."""
        return replace(self, lock_timeout_s=self.give_up_after_s)


def check_server_version(server_version_num: int) -> None:
    """MigrationError for a server older than the oldest supported major, before anything is applied."""
    major = server_version_num // 10000
    if major < SUPPORTED[0]:
        raise MigrationError(
            f"PostgreSQL {major} is older than the oldest this version supports ({SUPPORTED[0]}; supported: "
            f"{SUPPORTED[0]} to {SUPPORTED[1]}). Nothing was applied: upgrade the server first."
        )


def direct_connection_url(conn: psycopg.Connection, url: str) -> str:
    """The URL the upgrade must use: ``url`` unless ``conn`` goes through a transaction pooler, then
    OUTBOX_DIRECT_DATABASE_URL; MigrationError when that is unset."""
    if not pooler.behind_pooler(conn):
        return url
    direct = pooler.direct_database_url()
    if direct is None:
        raise MigrationError(
            "db upgrade goes through a connection pooler (PgBouncer or its kind): its session lock would be left to "
            f"whichever client the pooler pairs next. Set {pooler.DIRECT_DATABASE_URL_ENV} to a direct connection to "
            "the server (or point OUTBOX_DATABASE_URL at it for the upgrade). Nothing was applied."
        )
    return direct


def run_with_lock_waits(
    conn: psycopg.Connection,
    name: str,
    apply: Callable[[], None],
    waits: LockWaits,
    *,
    clock: Callable[[], float],
    watch: BlockerWatch | None = None,
) -> None:
    """``apply`` (one migration, in its own transaction) under ``lock_timeout``, tried again each time a lock is not
    granted in time, until ``waits.give_up_after_s``; then MigrationError naming what held it. With a ``watch``,
    the next try waits for the transactions the statement waited for to end (none queues in front of the
    application's writes meanwhile); without one, or when it saw none, after a backoff."""
    started, backoff, tries = clock(), FIRST_BACKOFF_S, 0
    give_up_at = started + waits.give_up_after_s
    while True:
        tries += 1
        blockers: dict[str, Blocker] = {}
        try:
            conn.execute(shared_query("migration_lock_timeout_set"), {"ms": f"{round(waits.lock_timeout_s * 1000)}ms"})
            watched = watch is not None and waits.lock_timeout_s < waits.give_up_after_s  # not a concurrent build
            looking = watch.watching(conn.info.backend_pid) if watch is not None and watched else nullcontext(blockers)
            with looking as blockers:
                apply()
            return
        except psycopg.errors.LockNotAvailable:
            if watch is not None and blockers:
                _wait_for_blockers(watch, name, waits, dict(blockers), tries, give_up_at, clock)
                continue
            holders = _lock_holders(conn)
            if clock() + backoff > give_up_at:
                raise _gave_up(name, waits, tries, holders) from None
            if waits.said is not None:
                waits.said(
                    f"migration {name}: a lock was not granted in {waits.lock_timeout_s:g} s ({holders}); "
                    f"the application's writes go on; trying again in {backoff:g} s"
                )
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            conn.execute(shared_query("migration_lock_timeout_reset"))


def _wait_for_blockers(
    watch: BlockerWatch,
    name: str,
    waits: LockWaits,
    blockers: dict[str, Blocker],
    tries: int,
    give_up_at: float,
    clock: Callable[[], float],
) -> None:
    """Wait, holding no lock, for the transactions a try waited for; MigrationError if one outlasts the budget."""
    holders = "held by " + describe(blockers)
    if waits.said is not None:
        waits.said(
            f"migration {name}: a lock was not granted in {waits.lock_timeout_s:g} s ({holders}); the "
            "application's writes go on; trying again when that transaction ends"
        )
    if not watch.wait_for_end(blockers, give_up_at, clock):
        raise _gave_up(name, waits, tries, holders)


def _gave_up(name: str, waits: LockWaits, tries: int, holders: str) -> MigrationError:
    return MigrationError(
        f"migration {name} could not take its locks in {waits.give_up_after_s:.0f} s ({tries} tries, "
        f"{waits.lock_timeout_s:g} s each); {holders}. Nothing of it was applied; run db upgrade again once that "
        "transaction ends."
    )


def _lock_holders(conn: psycopg.Connection) -> str:
    """Who likely held the lock, for people: the database's longest-open transactions (the wait is over by now,
    so the blocker itself can no longer be asked for)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(shared_query("migration_lock_holders")).fetchall()
    if not rows:
        return "a transaction that has ended since"
    return "the longest-open transactions: " + "; ".join(
        f"pid {row['pid']} ({row['application_name'] or 'no application_name'}, {row['state']}, transaction open "
        f"{row['xact_s']:.0f} s)"
        for row in rows
    )
