"""An adopter's stack with many module tables (issue 23): `outbox-pipelines dev` in a project of its own.

The project is a directory of the team's, not this repository: its ``pyproject.toml`` and ``outbox.toml``
declare ``tables`` module tables (``mod00_outbox`` ...) sending to a webhook (an HttpSink on 127.0.0.1 that
counts each idempotency key), plus the mistakes people make: a table whose handlers module cannot be
imported, one whose section is invalid, and one whose destination is down. ``dev`` runs in the project
directory with its defaults (one relay group), a fresh database from the session's server, a webhook
receiver for alerts, and DAGSTER_HOME in the stack's temp dir. Used by the drills (a dozen tables, in
.ci/run) and the soak (50 tables).
"""

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines_tests.drills.conftest import REPO, DevProcess, WebhookReceiver, tail
from outbox_pipelines_tests.helpers import QueriesDatabase, free_port
from outbox_pipelines_tests.sink import HttpSink

BROKEN_IMPORT, BROKEN_SECTION, DOWN = "payroll_outbox", "ledger_outbox", "crm_outbox"
GIB = 1024**3


def module_tables(n: int) -> list[str]:
    return [f"mod{i:02d}_outbox" for i in range(n)]


class ManyTablesStack(QueriesDatabase):
    def __init__(self, pg_server: Any, tables: int) -> None:
        self.pg_server = pg_server
        self.tables = module_tables(tables)
        self.tmp = Path(tempfile.mkdtemp(prefix="outbox-many-tables-"))
        self.project = self.tmp / "platform_service"
        self.project.mkdir()
        self.db_name, self.db_url = pg_server.create_database()
        self.sink = HttpSink().start()
        self.receiver = WebhookReceiver().start()
        port = free_port()
        self.ui_url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
        self.dev_log = self.tmp / "dev.log"
        self.dev = DevProcess(
            port,
            self.dev_log,
            {
                **env,
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
                "OUTBOX_DATABASE_URL": self.db_url,
                "OUTBOX_ALERT_WEBHOOK_URL": self.receiver.url,
                "OUTBOX_UI_URL": self.ui_url,
                "DAGSTER_HOME": str(self.tmp / "dagster_home"),
            },
            self.project,
        )
        self.write_project()

    @property
    def database_url(self) -> str:
        return self.db_url

    def write_project(self) -> None:
        (self.project / "pyproject.toml").write_text('[project]\nname = "platform_service"\nversion = "1.0.0"\n')
        sections = [
            f'[tables.{name}]\ndestination = "http"\nurl = "{self.sink.url}{name}"\nmode = "competing"\n'
            for name in self.tables
        ]
        sections += [
            f'[tables.{BROKEN_IMPORT}]\ndestination = "handlers"\nhandlers = "payroll.handlers:registry"\n',
            f'[tables.{BROKEN_SECTION}]\ndestination = "http"\nurl = "{self.sink.url}x"\nmode = "compting"\n',
            f'[tables.{DOWN}]\ndestination = "http"\nurl = "http://127.0.0.1:{free_port()}/crm"\n',
        ]
        (self.project / "outbox.toml").write_text("\n".join(sections))
        for name in [*self.tables, BROKEN_IMPORT, BROKEN_SECTION, DOWN]:
            create_table(self.db_url, name)

    def start(self) -> float:
        self.dev.start()
        return self.dev.wait_ready(timeout_s=240)

    def enqueue_everywhere(self, per_table: int, prefix: str) -> float:
        """``per_table`` messages into every table, the broken ones too, in one transaction; its commit time."""
        with self.connect(autocommit=False) as conn:
            for name in [*self.tables, BROKEN_IMPORT, BROKEN_SECTION, DOWN]:
                Outbox(name).enqueue_many(
                    conn,
                    [
                        Message(topic="module.changed", payload={"n": i}, event_id=f"{prefix}-{name}-{i}")
                        for i in range(per_table)
                    ],
                    outside_transaction=True,
                )
            conn.commit()
        return time.monotonic()

    def sent_in(self, name: str, prefix: str) -> int:
        return self.scalar(f"SELECT count(*) FROM {name} WHERE status = 'sent' AND event_id LIKE %s", (f"{prefix}-%",))

    def rss_bytes(self) -> tuple[int, int]:
        """The resident memory of every process under dev (webserver, daemon, code server, runs) and their count."""
        total = count = 0
        for pid in self.dev.leftovers():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        count += 1
        return total, count

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.dev.graphql(query, variables)

    def diagnostics(self) -> str:
        return f"tmp {self.tmp}\n--- dev.log ---\n{tail(self.dev_log, 80)}"

    def close(self) -> None:
        self.dev.stop(signal.SIGTERM, grace_s=60)
        self.dev.kill_leftovers()
        self.sink.stop()
        self.receiver.stop()
        for name in (f"{self.db_name}_dagster"[:63], self.db_name):
            with contextlib.suppress(psycopg.Error):
                self.pg_server.drop_database(name)
        if os.environ.get("OUTBOX_DRILL_KEEP_TMP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"kept {self.tmp}", file=sys.stderr)


LAUNCH = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
RUN = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status jobName startTime tags { key value } } } }"
RUNS = """query($filter: RunsFilter) { runsOrError(filter: $filter) {
  ... on Runs { results { runId status jobName tags { key value } } } } }"""
TERMINATE = "mutation($id: String!) { terminateRun(runId: $id) { __typename } }"
REPOSITORY = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"
