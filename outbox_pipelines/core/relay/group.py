"""A relay group: one process relays many outbox tables, and what it costs grows with the work, not the tables.

A quiet table holds nothing but a waiting thread; a table with work gets an activation (its ``Relay``) while a
place is free; one table's trouble is recorded for it alone. Parts: group_places.py, group_tables.py,
group_watcher.py; this module runs them. Why: docs/explanation/front-ends.md, "Relay groups: how a run shares".
"""

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.wiring import build_destination
from outbox_pipelines.core.errors import ConfigError, OutboxError
from outbox_pipelines.core.relay.budget import check_budget
from outbox_pipelines.core.relay.group_places import Places
from outbox_pipelines.core.relay.group_tables import GroupReport, TableWorker, clear_problem, tell_problem
from outbox_pipelines.core.relay.group_watcher import Watcher
from outbox_pipelines.core.relay.loop import Relay
from outbox_pipelines.core.relay.report import RelayReport
from outbox_pipelines.core.relay.stop import StopDeadline, StopReason, StopRequest, stop_timeout_s
from outbox_pipelines.core.relay.table_relay import freeze_startup_objects
from outbox_pipelines.core.settings import Settings, TableSettings
from outbox_pipelines.core.settings.owners import without_tables_owned_elsewhere
from outbox_pipelines.core.storage import pooler, schema_version
from outbox_pipelines.core.storage.db import connect
from outbox_pipelines.core.storage.table import SharedTables
from outbox_pipelines.core.telemetry import tracing

log = logging.getLogger("outbox_pipelines.relay")

# Defaults (a relay group's knobs; docs/explanation/front-ends.md, "Relay groups").
PLACES = 16  # tables active at once: each holds the relay's session and its lease keeper's connection
LINGER_S = 15.0  # an active table with nothing to do keeps its relay this long (a trickle stays warm)
SLICE_S = 60.0  # while another table waits for a place, an active one gives its place up after this long
POLL_S = 1.0  # how often the quiet tables are asked for rows that became due
# A table whose relay raised waits this long before it is tried again, doubling up to the last.
RETRY_BACKOFF_S = (5.0, 10.0, 20.0, 40.0, 60.0)
# A table whose single-active lock another relay holds is tried again after this long.
LOCK_HELD_RETRY_S = 10.0
_THREAD_PREFIX = "outbox-group-table-"  # a table's thread (the watcher's is outbox-group-<group>)

Progress = Callable[["GroupRelay"], None]


class GroupRelay:
    def __init__(
        self,
        url: str,
        settings: Settings,
        table_names: Sequence[str],
        *,
        group: str = "default",
        worker_prefix: str,
        run_id: str | None = None,
        job: str | None = None,
        direct_url: str | None = None,
        places: int = PLACES,
        linger_s: float = LINGER_S,
        slice_s: float = SLICE_S,
        poll_s: float = POLL_S,
        progress: Progress | None = None,
        progress_every_s: float = 30.0,
        destinations: Callable[[TableSettings, Settings], Destination] = build_destination,
    ) -> None:
        self.url, self.settings, self.group = url, settings, group
        self.worker_prefix, self.run_id, self.job, self.direct_url = worker_prefix, run_id, job, direct_url
        self.linger_s, self.slice_s, self.poll_s = linger_s, slice_s, poll_s
        self.places = Places(max(1, places))
        self.progress, self.progress_every_s = progress, progress_every_s
        self._build = destinations
        self.workers = {name: TableWorker(settings.table(name)) for name in table_names}
        self._stop = StopRequest()
        self.stop_timeout_s = float(stop_timeout_s())  # how long a stop may take before relays are left behind
        self._deadline: float | None = None
        self._lock = threading.Lock()

    # -- control -------------------------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        """Every active relay settles its batch in flight and stops; the quiet ones stop at once. Safe from a
        signal handler and from any thread: it only records the request (relay/stop.py), which the run's
        thread passes on to every table within a slice (``_stop_every_table``)."""
        self._stop.request()

    def _stop_every_table(self) -> None:
        """Wake every table's thread and stop every relay: in the run's thread once its wait ends, never in a
        signal handler (it sets Events, and the handler may run while this thread holds one's lock)."""
        self._stop.request()
        for worker in list(self.workers.values()):
            worker.wake.set()
            if worker.relay is not None:
                worker.relay.request_stop()

    @property
    def stop_request(self) -> StopRequest:
        """What ``request_stop`` sets (a process's StopDeadline watches it: relay/stop.py)."""
        return self._stop

    def still_running(self) -> str:
        """The group and its tables still active, for the sentence of a stop that took too long."""
        active = sorted(name for name, worker in self.workers.items() if worker.active)
        return f"relay group {self.group} (still relaying: {', '.join(active) or 'none'})"

    def report(self) -> GroupReport:
        """What the group did so far (the running activations included)."""
        report = GroupReport(self.group)
        for name, worker in sorted(self.workers.items()):
            totals = worker.totals()
            if totals is not None:
                report.tables[name] = totals
            if worker.problem:
                report.problems[name] = worker.problem
        return report

    # -- the run -------------------------------------------------------------------------------------------
    def run(self, *, max_seconds: float | None = None, once: bool = False) -> GroupReport:
        """Relay the group's tables until the time budget is used or a stop is requested (``once``: drain
        what each table has ready now, then end)."""
        check_budget(max_seconds)
        started = time.monotonic()
        self._deadline = None if max_seconds is None else started + max_seconds
        self._prepare()
        # The relays and destinations just built live as long as the run: out of the collector's sight, as the
        # process's start-up objects are (table_relay.freeze_startup_objects; a full pass walks them all).
        gc.freeze()
        watcher = (
            None
            if once
            else Watcher(
                self.direct_url or self.url, self.group, self.workers, poll_s=self.poll_s, stop=self._stop
            ).start()
        )
        threads = [
            threading.Thread(target=self._work, args=(worker, once), daemon=True, name=_THREAD_PREFIX + worker.name)
            for worker in self.workers.values()
            if not worker.left_out
        ]
        for thread in threads:
            thread.start()
        stopped_because = self._wait(threads, once, started)
        self._stop_every_table()
        stuck = self._join(threads, watcher)
        for worker in self.workers.values():
            if worker.destination is not None and worker.name not in stuck:  # a stuck relay may still use its own
                worker.destination.close()
        report = self.report()
        if stuck:
            stopped_because += f"; {', '.join(stuck)} did not stop within {self.stop_timeout_s:g}s (left running)"
        report.seconds, report.stopped_because = time.monotonic() - started, stopped_because
        return report

    def _join(self, threads: list[threading.Thread], watcher: threading.Thread | None) -> list[str]:
        """Wait for every table's thread, and the watcher, at most ``stop_timeout_s`` in all (relay/stop.py): a
        relay stuck in a call that does not return is left behind (its thread is a daemon), named in the log and
        the report; its rows go back to pending when their lease expires. The tables left behind, by name."""
        deadline = time.monotonic() + self.stop_timeout_s
        for thread in [*threads, *([watcher] if watcher is not None else [])]:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        stuck = sorted(thread.name.removeprefix(_THREAD_PREFIX) for thread in threads if thread.is_alive())
        if stuck:
            log.error(
                "relay group %s: %s did not stop within %gs of the stop request (a database or destination call "
                "that does not return); left running, their rows go back to pending when their lease expires",
                self.group,
                ", ".join(stuck),
                self.stop_timeout_s,
            )
        return stuck

    def _wait(self, threads: list[threading.Thread], once: bool, started: float) -> str:
        next_progress = started + self.progress_every_s
        while True:
            if self._stop.requested:
                return StopReason.STOP_REQUESTED
            if once and not any(thread.is_alive() for thread in threads):
                return StopReason.DRAINED
            if self._time_left() <= 0:
                return StopReason.TIME_BUDGET
            if self.progress is not None and time.monotonic() >= next_progress:
                self.progress(self)
                next_progress = time.monotonic() + self.progress_every_s
            self._stop.wait(min(0.5, self._time_left()))

    def _time_left(self) -> float:
        return float("inf") if self._deadline is None else self._deadline - time.monotonic()

    # -- before the first activation -------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Leave out the tables that do not exist, build every destination, and record or clear each problem.
        A database that cannot be reached ends the run here: the group cannot relay at all."""
        with connect(self.url) as conn:
            shared = SharedTables(conn)
            existing = set(shared.outbox_table_names())
            for worker in self.workers.values():
                if worker.name not in existing:
                    worker.left_out = True
                    self._problem(
                        worker,
                        f"{worker.name} does not exist in the database: create it with "
                        f"'outbox-pipelines db create-table {worker.name}'",
                        shared,
                    )
                    continue
                try:
                    worker.destination = self._build(worker.settings, self.settings)
                except (ConfigError, OutboxError, ImportError, ValueError, TypeError) as exc:
                    worker.left_out = True
                    self._problem(worker, f"{worker.name}: its destination cannot be built: {exc}", shared)
                    continue
                worker.relay = Relay(
                    self.url,
                    worker.settings,
                    worker.destination,
                    run_id=self.run_id,
                    job=self.job,
                    worker_id=f"{self.worker_prefix}:{worker.name}",
                    direct_url=self.direct_url,
                    progress=self._live(worker),
                    progress_every_s=5.0,
                )
                if shared.clear_relay_problem(worker.name):
                    log.warning("relay %s: its problem is over; relaying", worker.name)
                worker.wake.set()  # every table is looked at once as the run starts

    def _live(self, worker: TableWorker) -> Callable[[RelayReport], None]:
        def note(report: RelayReport) -> None:
            worker.live = report

        return note

    # -- one table ---------------------------------------------------------------------------------------------
    def _work(self, worker: TableWorker, once: bool) -> None:
        while not self._stop.requested:
            if once and worker.activations:
                return
            worker.wake.wait()  # set by the watcher, a backoff's end, or a stop (_stop_every_table sets every one)
            if self._stop.requested:
                continue
            backoff = worker.not_before - time.monotonic()
            if backoff > 0:  # a relay that raised (or a lock held elsewhere) waits out its backoff first
                self._stop.wait(min(backoff, 1.0))
                continue
            worker.wake.clear()
            if not self.places.take(self._stop):
                return
            try:
                self._activate(worker, once)
            finally:
                self.places.give_back()

    def _activate(self, worker: TableWorker, once: bool) -> None:
        relay = worker.relay
        assert relay is not None  # _prepare built it; a table left out has no thread
        worker.active, worker.activations = True, worker.activations + 1
        try:
            part = relay.run(
                max_seconds=max(self._time_left(), 0.0) if self._deadline else None,
                once=once,
                release=None if once else self._release,
            )
        except Exception as exc:  # one table's relay must not take its group down
            worker.failures += 1
            wait = RETRY_BACKOFF_S[min(worker.failures, len(RETRY_BACKOFF_S)) - 1]
            worker.not_before = time.monotonic() + wait
            worker.wake.set()
            self._problem(
                worker,
                f"{worker.name}: its relay failed ({type(exc).__name__}: {exc}); it is tried "
                "again with a growing backoff (up to a minute), the group's other tables go on",
            )
            return
        finally:
            worker.active = False
        worker.failures = 0
        self._add(worker, part)
        if worker.problem is not None:  # it ran without failing: the problem is over
            self._clear_problem(worker)
        if part.stopped_because == StopReason.GAVE_WAY:
            worker.wake.set()  # it still has work: back in the queue for a place
        elif part.stopped_because == StopReason.LOCK_HELD_ELSEWHERE:
            worker.not_before = time.monotonic() + LOCK_HELD_RETRY_S

    def _release(self, idle_s: float, active_s: float) -> str | None:
        """Ends a table's activation: idle for linger_s, or its turn is over while another table waits."""
        if idle_s >= self.linger_s or (idle_s >= 0.5 and self.places.contended):
            return StopReason.IDLE  # quiet again: the watcher wakes it when it has work
        if active_s >= self.slice_s and idle_s < active_s and self.places.contended:
            return StopReason.GAVE_WAY  # busy (it claimed rows): back in the queue, behind the tables that waited
        return None

    def _add(self, worker: TableWorker, part: RelayReport) -> None:
        with self._lock:
            if worker.report is None:
                worker.report = part
            else:
                worker.report.merge(part)
            worker.live = None

    # -- problems ----------------------------------------------------------------------------------------------
    def _problem(self, worker: TableWorker, text: str, shared: SharedTables | None = None) -> None:
        tell_problem(self.url, self.group, worker, text, shared)

    def _clear_problem(self, worker: TableWorker) -> None:
        clear_problem(self.url, self.group, worker)


def run_group_relay(
    url: str,
    settings: Settings,
    group: str,
    *,
    max_seconds: float | None = None,
    once: bool = False,
    worker_prefix: str,
    run_id: str | None = None,
    job: str | None = None,
    direct_url: str | None = None,
    progress: Progress | None = None,
    group_started: Callable[[GroupRelay], None] | None = None,
    install_signal_handlers: bool = False,
    places: int = PLACES,
    linger_s: float = LINGER_S,
    slice_s: float = SLICE_S,
    poll_s: float = POLL_S,
) -> GroupReport:
    """Relay every table of ``group`` that relays (``relay_enabled``): what the CLI and the Dagster op call."""
    check_budget(max_seconds)
    freeze_startup_objects()
    tracing.configure_from_env("outbox-relay")  # no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    schema_version.require_current_schema(url)  # new code on an old schema: one clear refusal, before anything runs
    ours = without_tables_owned_elsewhere(url, settings)  # another project's tables are its relays'
    names = [name for name in ours.groups().get(group, []) if ours.tables[name].relay_enabled]
    if not names and (foreign := set(settings.groups().get(group, [])) - set(ours.tables)):
        raise ConfigError("; ".join(ours.broken[name] for name in sorted(foreign)))
    settings = ours
    if not names:
        known = ", ".join(sorted(settings.groups())) or "none"
        raise ConfigError(
            f"relay group {group!r} has no table to relay; groups: {known} "
            "(a table joins one with group = \"NAME\" in outbox.toml; the default group is 'default')"
        )
    relay = GroupRelay(
        url,
        settings,
        names,
        group=group,
        worker_prefix=worker_prefix,
        run_id=run_id,
        job=job,
        direct_url=direct_url or pooler.direct_database_url(),
        progress=progress,
        places=places,
        linger_s=linger_s,
        slice_s=slice_s,
        poll_s=poll_s,
    )
    deadline = None
    if install_signal_handlers:  # the process is the group's (the CLI's): its stop is bounded (relay/stop.py)
        import signal

        deadline = StopDeadline(relay.stop_request, relay.still_running).arm()
        relay.stop_timeout_s = deadline.bound_s + 1.0  # the process's deadline ends it first, with its exit code
        signal.signal(signal.SIGTERM, relay.request_stop)
        signal.signal(signal.SIGINT, relay.request_stop)
    if group_started is not None:
        group_started(relay)
    try:
        return relay.run(max_seconds=max_seconds, once=once)
    finally:
        if deadline is not None:
            deadline.disarm()
