"""The production topology of docs/deploy.md ("Local processes"), live on this machine.

Three separate processes, started once for the module, each in a session of its own:

- ``dagster code-server start -m outbox_pipelines.definitions -a defs`` (gRPC, a free port);
- ``dagster-webserver -w WORKSPACE`` and ``dagster-daemon run -w WORKSPACE``, where WORKSPACE is
  ``deploy/workspace.local.yaml`` with the code server's port put in.

They share one environment: ``DAGSTER_HOME`` (a temporary directory holding a copy of
``deploy/dagster.yaml``), ``OUTBOX_DATABASE_URL`` (a new, empty database on the session's test
server, migrated with ``outbox-pipelines db upgrade``), ``OUTBOX_DAGSTER_PG_URL`` (Dagster's storage,
a second database on the same server), ``OUTBOX_BROKER_URL`` (a local HTTP sink, the destination of
``outbox_orders``) and ``OUTBOX_RELAY_RUN_MINUTES=1`` (the relay schedules tick every minute).

Before the daemon starts, every schedule and sensor of the code location is stopped through the
webserver's GraphQL, except one: ``relay_outbox_events_every_1_minutes``, started with the
``startSchedule`` mutation. Nothing else launches runs, so each test knows which run did what.

- ``test_the_daemon_launches_a_scheduled_relay_run``: the daemon's scheduler launches a run of
  ``relay_group_default_job`` at the next minute; it succeeds and relays the events enqueued before.
  A relay run relays for its cadence plus a minute of overlap (``defs/relay.py``), so this run
  lasts two minutes: the module takes about three to four.
- ``test_a_relay_run_launched_through_graphql_succeeds``: once that scheduled run has ended (its
  group hosts ``outbox_orders`` too, and two relays would race for the orders), orders enqueued with
  the public API (``Outbox.enqueue_many``), ``relay_job`` (for outbox_orders) launched through the
  webserver's GraphQL; the queued run is dequeued by the daemon and executed by the code server. The
  run succeeds, its relay is the one that sent the messages, and the sink received each one.

Once the scheduled run is found, the ``scheduled_run`` fixture stops the schedule again (one run is
enough), so no relay but the launched one runs while the GraphQL test does. Teardown first
terminates, through GraphQL, any run still active (a failed test may leave one), then stops each
process by its pid: SIGTERM to its process group and to any descendant that left the group, once
each, SIGKILL after a timeout. It drops both databases. The run ids are printed (``pytest -s``).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from dagster_graphql import DagsterGraphQLClient
from psycopg import sql
from psycopg.rows import dict_row

from outbox_pipelines.core.storage.db import DATABASE_URL_ENV
from outbox_pipelines.defs.dagster_home import DAGSTER_PG_URL_ENV, dagster_storage_url
from outbox_pipelines.defs.relay import DEFAULT_RUN_MINUTES, OVERLAP_S, RUN_MINUTES_ENV
from outbox_pipelines.defs.relay_group import GROUP_TAG, hosted_tag, relay_group_job_name
from outbox_pipelines.defs.resources import TABLE_TAG
from outbox_pipelines_tests.conftest import REPO
from outbox_pipelines_tests.helpers import enqueue_n, statuses
from outbox_pipelines_tests.processes import free_port, port_open
from outbox_pipelines_tests.scratch import TemplateDatabases
from outbox_pipelines_tests.sink import HttpSink

pytestmark = [
    pytest.mark.drill,
    # dagster_graphql's client calls gql's execute() the way gql 4 deprecates: theirs, not ours.
    pytest.mark.filterwarnings("ignore:Using variable_values and operation_name:DeprecationWarning"),
]

BIN = Path(sys.executable).parent
DEPLOY = REPO / "deploy"
REPOSITORY = "__repository__"  # the repository name Dagster gives a Definitions object
RUN_MINUTES = 1
SCHEDULED_TABLE = "outbox_events"
SCHEDULE = f"relay_group_default_every_{RUN_MINUTES}_minutes"  # the relay group every shipped table is in
LAUNCHED_TABLE = "outbox_orders"
SCHEDULE_TAG = "dagster/schedule_name"
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
ACTIVE = ["QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"]
START_DEADLINE_S = 180.0  # a cold start of three Dagster processes on 2 busy cores
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 2500
POLL_S = 0.5


# -- GraphQL ------------------------------------------------------------------------------------
LOCATIONS = """{ workspaceOrError { __typename
  ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename ... on PythonError { message } } } }
  ... on PythonError { message } } }"""
INSTIGATORS = """query ($selector: RepositorySelector!) { repositoryOrError(repositorySelector: $selector) {
  __typename
  ... on Repository { schedules { name cronSchedule scheduleState { id status } }
                      sensors { name sensorState { id status } } }
  ... on PythonError { message } } }"""
STOP_SCHEDULE = """mutation ($id: String!) { stopRunningSchedule(id: $id) { __typename
  ... on ScheduleStateResult { scheduleState { status } } ... on PythonError { message } } }"""
STOP_SENSOR = """mutation ($id: String!) { stopSensor(id: $id) { __typename
  ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } } }"""
START_SCHEDULE = """mutation ($selector: ScheduleSelector!) { startSchedule(scheduleSelector: $selector) {
  __typename
  ... on ScheduleStateResult { scheduleState { status } }
  ... on ScheduleNotFoundError { message } ... on PythonError { message } } }"""
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"
RUN = """query ($id: ID!) { runOrError(runId: $id) { __typename
  ... on Run { runId status jobName tags { key value } } ... on PythonError { message } } }"""
RUNS = """query ($filter: RunsFilter) { runsOrError(filter: $filter) { __typename
  ... on Runs { results { runId status jobName tags { key value } } } ... on PythonError { message } } }"""
TERMINATE_RUNS = """mutation ($ids: [String!]!) { terminateRuns(runIds: $ids) { __typename
  ... on TerminateRunsResult { terminateRunResults { __typename } } ... on PythonError { message } } }"""
RUN_LOGS = """query ($id: ID!) { logsForRun(runId: $id) { __typename
  ... on EventConnection { events { __typename ... on MessageEvent { message level } } } } }"""


# -- processes -----------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc), also those that left its process group."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])  # the field after the state, past "(comm)"
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Process:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str], cwd: Path) -> "Process":
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        state = (
            "not started"
            if self.proc is None
            else ("running" if self.proc.poll() is None else f"exited with {self.proc.returncode}")
        )
        return (
            f"--- {self.name} (pid {self.proc.pid if self.proc else '-'}, {state}): {self.log_path}\n"
            f"{text[-LOG_TAIL_CHARS:]}"
        )

    def stop(self) -> None:
        """SIGTERM to its process group, and to any descendant that left the group, each once, by pid;
        SIGKILL to whatever is left after a timeout."""
        if self.proc is None or self.proc.poll() is not None:
            return
        group = self.proc.pid  # start_new_session: the leader's pid is the group's id
        outside = [pid for pid in _descendants(group) if _group_of(pid) not in (group, None)]
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for pid in outside:
            _signal(pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in outside):
            time.sleep(0.2)
        try:
            os.killpg(group, signal.SIGKILL)  # stragglers of the group (the leader may be gone already)
        except ProcessLookupError:
            pass
        for pid in outside:
            _signal(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@dataclass
class Topology:
    env: dict[str, str]
    outbox_url: str
    webserver_port: int
    location: str
    processes: list[Process] = field(default_factory=list)
    schedule_started_at: float = 0.0
    sink: HttpSink | None = None

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes)

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = httpx.post(
            f"http://127.0.0.1:{self.webserver_port}/graphql", json={"query": query, "variables": variables}, timeout=30
        )
        answer.raise_for_status()
        body: dict[str, Any] = answer.json()
        assert not body.get("errors"), f"GraphQL errors: {body['errors']}"
        data: dict[str, Any] = body["data"]
        return data

    def wait_for(self, what: str, ready: Callable[[], Any], deadline_s: float = START_DEADLINE_S) -> Any:
        """Poll ``ready`` until it returns something truthy; fail with the processes' log tails."""
        deadline = time.monotonic() + deadline_s
        last_error = ""
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.proc is not None and process.proc.poll() is not None:
                    pytest.fail(f"{process.name} exited while waiting for {what}\n{self.logs()}")
            try:
                value = ready()
                if value:
                    return value
            except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(POLL_S)
        pytest.fail(f"{what}: not within {deadline_s:.0f} s (last error: {last_error or 'none'})\n{self.logs()}")

    def selector(self, **extra: str) -> dict[str, str]:
        return {"repositoryLocationName": self.location, "repositoryName": REPOSITORY, **extra}

    def run(self, run_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.graphql(RUN, id=run_id)["runOrError"]
        assert found["__typename"] == "Run", found
        return found

    def run_messages(self, run_id: str, last: int = 25) -> str:
        """The last messages of a run's event log, for an assertion message."""
        try:
            events = self.graphql(RUN_LOGS, id=run_id)["logsForRun"].get("events", [])
        except (httpx.HTTPError, AssertionError, KeyError) as exc:
            return f"(its event log could not be read: {exc})"
        lines = [f"{e.get('level')}: {e.get('message')}" for e in events if e.get("message")]
        return "\n".join(lines[-last:])

    def stop_schedule(self, name: str) -> None:
        repository = self.graphql(INSTIGATORS, selector=self.selector())["repositoryOrError"]
        for schedule in repository["schedules"]:
            if schedule["name"] == name and schedule["scheduleState"]["status"] == "RUNNING":
                self.graphql(STOP_SCHEDULE, id=schedule["scheduleState"]["id"])

    def quiesce(self, timeout_s: float = 60.0) -> None:
        """Before the processes stop: no further ticks, and every active run terminated through GraphQL,
        as an operator would (the relay settles its batch in flight and the run ends CANCELED)."""
        self.stop_schedule(SCHEDULE)
        active = self.graphql(RUNS, filter={"statuses": ACTIVE})["runsOrError"]["results"]
        if not active:
            return
        ids = [run["runId"] for run in active]
        print(f"\nterminating runs still active at the end: {ids}")
        self.graphql(TERMINATE_RUNS, ids=ids)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            runs = self.graphql(RUNS, filter={"runIds": ids})["runsOrError"]["results"]
            if all(run["status"] in TERMINAL for run in runs):
                return
            time.sleep(POLL_S)

    def wait_for_run(self, run_id: str, deadline_s: float) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            run = self.run(run_id)
            return run if run["status"] in TERMINAL else None

        run: dict[str, Any] = self.wait_for(f"run {run_id} to end", ended, deadline_s)
        return run


def _tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def _location_loaded(topology: Topology) -> bool:
    entries = topology.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
    [entry] = [e for e in entries if e["name"] == topology.location]
    loaded = entry["locationOrLoadError"] or {}
    if entry["loadStatus"] == "LOADED" and loaded.get("__typename") == "PythonError":
        # The webserver asked before the code server answered: ask it to load the location again.
        DagsterGraphQLClient("127.0.0.1", port_number=topology.webserver_port).reload_repository_location(
            topology.location
        )
        return False
    return entry["loadStatus"] == "LOADED" and loaded.get("__typename") == "RepositoryLocation"


def _only_the_schedule_under_test(topology: Topology) -> None:
    """Stop every schedule and sensor (most are RUNNING by default), then start the one under test."""
    repository = topology.graphql(INSTIGATORS, selector=topology.selector())["repositoryOrError"]
    assert repository["__typename"] == "Repository", repository
    schedules = {s["name"]: s for s in repository["schedules"]}
    assert SCHEDULE in schedules, f"no schedule {SCHEDULE}: {sorted(schedules)}"
    assert schedules[SCHEDULE]["cronSchedule"] == f"*/{RUN_MINUTES} * * * *"
    for schedule in repository["schedules"]:
        if schedule["scheduleState"]["status"] == "RUNNING" and schedule["name"] != SCHEDULE:
            stopped = topology.graphql(STOP_SCHEDULE, id=schedule["scheduleState"]["id"])["stopRunningSchedule"]
            assert stopped.get("scheduleState", {}).get("status") == "STOPPED", (schedule["name"], stopped)
    for sensor in repository["sensors"]:
        if sensor["sensorState"]["status"] == "RUNNING":
            stopped = topology.graphql(STOP_SENSOR, id=sensor["sensorState"]["id"])["stopSensor"]
            assert stopped.get("instigationState", {}).get("status") == "STOPPED", (sensor["name"], stopped)
    started = topology.graphql(START_SCHEDULE, selector=topology.selector(scheduleName=SCHEDULE))["startSchedule"]
    assert started.get("scheduleState", {}).get("status") == "RUNNING", started
    topology.schedule_started_at = time.time()


def _daemons_healthy(topology: Topology) -> bool:
    daemons = topology.graphql(DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
    by_type = {d["daemonType"]: d for d in daemons}
    wanted = ("SCHEDULER", "QUEUED_RUN_COORDINATOR")
    return all(by_type.get(name, {}).get("healthy") for name in wanted)


def _create_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _drop_databases(admin_url: str, *names: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _workspace(path: Path, code_port: int) -> str:
    """deploy/workspace.local.yaml with the code server's port; returns the location name it gives."""
    workspace = yaml.safe_load((DEPLOY / "workspace.local.yaml").read_text())
    [entry] = workspace["load_from"]
    entry["grpc_server"]["port"] = code_port
    path.write_text(yaml.safe_dump(workspace))
    return str(entry["grpc_server"]["location_name"])


@pytest.fixture(scope="module")
def topology(pg_server: TemplateDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    root = tmp_path_factory.mktemp("topology")
    outbox_db = f"{pg_server.prefix}_topology"
    outbox_url = pg_server.url_for(outbox_db)
    dagster_db = f"{outbox_db}_dagster"[:63]  # the name dagster_storage_url gives it
    sink = HttpSink().start()
    processes: list[Process] = []
    try:
        # The outbox database starts empty and is migrated as an operator does it.
        _create_database(pg_server.admin_url, outbox_db)
        home = root / "dagster_home"
        home.mkdir()
        shutil.copyfile(DEPLOY / "dagster.yaml", home / "dagster.yaml")
        shutil.copyfile(DEPLOY / "outbox.toml", root / "outbox.toml")  # the image's working directory's
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_", "_OUTBOX_"))}
        env.update(
            {
                "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
                "PYTHONPATH": str(REPO),
                "DAGSTER_HOME": str(home),
                DATABASE_URL_ENV: outbox_url,
                DAGSTER_PG_URL_ENV: dagster_storage_url(outbox_url),  # creates '<outbox db>_dagster' next to it
                "OUTBOX_BROKER_URL": sink.url,
                RUN_MINUTES_ENV: str(RUN_MINUTES),
            }
        )
        assert env[DAGSTER_PG_URL_ENV].startswith("postgresql+psycopg2://")
        upgrade = subprocess.run(
            [str(BIN / "outbox-pipelines"), "db", "upgrade"],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr

        code_port, webserver_port = free_port(), free_port()
        workspace = root / "workspace.yaml"
        location = _workspace(workspace, code_port)
        topology = Topology(env, outbox_url, webserver_port, location, processes, sink=sink)
        code_server = Process(
            "code server",
            [
                str(BIN / "dagster"),
                "code-server",
                "start",
                "-h",
                "127.0.0.1",
                "-p",
                str(code_port),
                "-m",
                "outbox_pipelines.definitions",
                "-a",
                "defs",
            ],
            root / "code-server.log",
        )
        webserver = Process(
            "webserver",
            [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(webserver_port), "-w", str(workspace)],
            root / "webserver.log",
        )
        daemon = Process("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], root / "daemon.log")

        started = time.monotonic()
        processes.append(code_server.start(env, root))
        topology.wait_for("the code server's port", lambda: port_open(code_port))
        processes.append(webserver.start(env, root))
        topology.wait_for(
            "the webserver's /server_info",
            lambda: (
                httpx.get(f"http://127.0.0.1:{webserver_port}/server_info", timeout=2)
                .json()
                .get("dagster_webserver_version")
            ),
        )
        topology.wait_for(
            "the code location, loaded by the webserver from the code server", lambda: _location_loaded(topology)
        )
        # Before the daemon runs, so that no other schedule or sensor launches a run meanwhile.
        _only_the_schedule_under_test(topology)
        processes.append(daemon.start(env, root))
        topology.wait_for("the daemon's scheduler and run queue", lambda: _daemons_healthy(topology))
        print(
            f"\ntopology up in {time.monotonic() - started:.1f} s: code server :{code_port}, "
            f"webserver :{webserver_port}, daemon; {root}"
        )
        yield topology
    finally:
        if len(processes) == 3:
            try:
                topology.quiesce()
            except Exception as exc:  # the processes are stopped below in any case
                print(f"\ncould not terminate the active runs through GraphQL: {exc}")
        for process in reversed(processes):  # daemon, webserver, then the code server and its runs
            process.stop()
        sink.stop()
        _drop_databases(pg_server.admin_url, outbox_db, dagster_db)


@pytest.fixture(scope="module")
def outbox(topology: Topology) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(topology.outbox_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture(scope="module")
def events_before_the_tick(topology: Topology, outbox: psycopg.Connection[Any]) -> list[int]:
    """Events enqueued right after the topology is up: the scheduled run finds them ready."""
    return enqueue_n(
        outbox, SCHEDULED_TABLE, 4, topic="org.changed", prefix="topo-ev-", payload=lambda i: {"org_id": f"org-{i}"}
    )


def _relay_of_run(outbox: psycopg.Connection[Any], table: str, run_id: str) -> list[dict[str, Any]]:
    return outbox.execute(
        "SELECT worker, stopped_at, stop_reason FROM outbox_relay_workers WHERE table_name = %s AND run_id = %s",
        (table, run_id),
    ).fetchall()


def _senders(outbox: psycopg.Connection[Any], table: str, event_prefix: str) -> set[str]:
    rows = outbox.execute(
        "SELECT DISTINCT worker FROM outbox_audit WHERE outbox_table = %s AND to_status = 'sent' AND event_id LIKE %s",
        (table, f"{event_prefix}%"),
    ).fetchall()
    return {r["worker"] for r in rows}


@pytest.fixture(scope="module")
def scheduled_run(topology: Topology, events_before_the_tick: list[int]) -> dict[str, Any]:
    """The first run of the schedule under test, waited for until it ended; the schedule is then stopped.

    Its group hosts every shipped table, ``outbox_orders`` too: the test that launches a relay of its
    own for ``outbox_orders`` waits for this run first, or the two relays would race for its orders.
    """
    # The first tick is at the next minute after the schedule started; the run then relays for its
    # cadence plus the overlap (two minutes here), and the daemon and code server need some seconds.
    run_seconds = RUN_MINUTES * 60 + OVERLAP_S
    assert DEFAULT_RUN_MINUTES != RUN_MINUTES  # the schedule's cadence came from RUN_MINUTES_ENV
    first_tick = (topology.schedule_started_at // 60 + 1) * 60
    ends_by = first_tick + run_seconds + 90  # wall-clock time by which the run must have ended

    def newest_scheduled_run() -> dict[str, Any] | None:
        found = topology.graphql(RUNS, filter={"tags": [{"key": SCHEDULE_TAG, "value": SCHEDULE}]})
        runs = found["runsOrError"]["results"]
        return runs[-1] if runs else None  # newest first: the first run of the schedule is the last

    run = topology.wait_for(f"a run from {SCHEDULE}'s tick", newest_scheduled_run, deadline_s=ends_by - time.time())
    run_id = run["runId"]
    topology.stop_schedule(SCHEDULE)  # one run is enough: no second relay run a minute later
    print(f"\nscheduled relay run launched by the daemon: {run_id} ({run['jobName']}), waiting for it to end")
    return topology.wait_for_run(run_id, deadline_s=ends_by - time.time())


def test_a_relay_run_launched_through_graphql_succeeds(
    topology: Topology, outbox: psycopg.Connection[Any], scheduled_run: dict[str, Any]
) -> None:
    # The scheduled group run (which hosts outbox_orders too) has ended: this run is the only relay.
    prefix = "topo-order-"
    enqueue_n(outbox, LAUNCHED_TABLE, 5, prefix=prefix)
    assert statuses(outbox, LAUNCHED_TABLE) == {"pending": 5}

    client = DagsterGraphQLClient("127.0.0.1", port_number=topology.webserver_port)
    job = "relay_job"  # one table, named in its run config
    run_id = client.submit_job_execution(
        job,
        repository_location_name=topology.location,
        repository_name=REPOSITORY,
        run_config={"ops": {"relay_table": {"config": {"table": LAUNCHED_TABLE, "once": True, "max_seconds": 60}}}},
        tags={"outbox/test": "production-topology"},
    )
    print(f"\nrelay run launched through GraphQL: {run_id} ({job})")

    run = topology.wait_for_run(run_id, deadline_s=150)
    context = f"run {run_id} ({job})"
    assert run["status"] == "SUCCESS", f"{context}: {run['status']}\n{topology.run_messages(run_id)}\n{topology.logs()}"
    assert _tags(run)[TABLE_TAG] == LAUNCHED_TABLE, f"{context}: the job's tag (per-table run limit) is missing"

    assert statuses(outbox, LAUNCHED_TABLE) == {"sent": 5}, context
    [relay] = _relay_of_run(outbox, LAUNCHED_TABLE, run_id)
    assert relay["stopped_at"] is not None, f"{context}: its relay never said goodbye: {relay}"
    assert _senders(outbox, LAUNCHED_TABLE, prefix) == {relay["worker"]}, f"{context}: another relay sent them"
    assert topology.sink is not None
    assert sorted(k for k in topology.sink.keys() if k.startswith(prefix)) == [f"{prefix}{i}" for i in range(5)], (
        f"{context}: the sink did not receive each order once"
    )


def test_the_daemon_launches_a_scheduled_relay_run(
    topology: Topology,
    outbox: psycopg.Connection[Any],
    events_before_the_tick: list[int],
    scheduled_run: dict[str, Any],
) -> None:
    run, run_id = scheduled_run, scheduled_run["runId"]
    context = f"scheduled run {run_id} ({run['jobName']})"
    assert run["status"] == "SUCCESS", f"{context}: {run['status']}\n{topology.run_messages(run_id)}\n{topology.logs()}"
    assert run["jobName"] == relay_group_job_name("default"), context
    tags = _tags(run)
    assert tags[SCHEDULE_TAG] == SCHEDULE, f"{context}: {tags}"
    assert tags[GROUP_TAG] == "default", f"{context}: {tags}"
    # The tables it hosts are hidden tags (.dagster/...): filterable, never a wall of tags in the Runs list.
    assert hosted_tag(SCHEDULED_TABLE) not in tags, f"{context}: {tags}"

    assert statuses(outbox, SCHEDULED_TABLE) == {"sent": len(events_before_the_tick)}, context
    [relay] = _relay_of_run(outbox, SCHEDULED_TABLE, run_id)
    assert _senders(outbox, SCHEDULED_TABLE, "topo-ev-") == {relay["worker"]}, f"{context}: another relay sent them"
