"""The Dagster jobs the page launches, through the Dagster webserver's GraphQL API (``launchRun``): the same
``replay_dead_job`` and ``skip_dead_job`` an operator launches from the launchpad, so run history, tags and the
jobs' own checks and audit stay Dagster's and the core's. A run is read back (its status, what its op logged,
its summary) to show what a dry run would do."""

from dataclasses import dataclass, field
from typing import Any

import httpx

from outbox_pipelines.core.redaction import mask_credentials
from outbox_pipelines.defs.links import DagsterLinks

# The jobs and their ops (defs/replay.py, defs/skip.py).
JOBS = {"replay": ("replay_dead_job", "replay_dead_op"), "skip": ("skip_dead_job", "skip_dead_op")}
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
# Tags the page sets on the runs it launches: where a run came from, and why it was launched for real.
LAUNCHED_BY_TAG, REASON_TAG = "outbox/launched_by", "outbox/reason"

_REPOSITORIES = """
query { repositoriesOrError { __typename
  ... on RepositoryConnection { nodes { name location { name } jobs { name } } }
  ... on PythonError { message } } }
"""
_LAUNCH = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } }
  ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } }
  ... on InvalidSubsetError { message }
  ... on UnauthorizedError { message }
  ... on PipelineNotFoundError { message } } }
"""
_RUN = """
query($id: ID!) { runOrError(runId: $id) { __typename
  ... on Run { status tags { key value }
    eventConnection { events { __typename
      ... on MessageEvent { message level stepKey }
      ... on ExecutionStepFailureEvent { error { message } }
      ... on ExecutionStepOutputEvent { metadataEntries { label
        ... on TextMetadataEntry { text } ... on IntMetadataEntry { intRepr }
        ... on BoolMetadataEntry { boolValue } ... on MarkdownMetadataEntry { mdStr } } } } } }
  ... on RunNotFoundError { message } ... on PythonError { message } } }
"""


class DagsterUnavailable(Exception):
    """The Dagster UI does not answer: one sentence saying what to do."""


class LaunchRefused(Exception):
    """Dagster (or the job's config schema) refused the launch: its messages."""


@dataclass
class RunView:
    run_id: str
    status: str
    dry_run: bool | None = None
    logged: list[str] = field(default_factory=list)  # what the op logged (INFO and above), in order
    failures: list[str] = field(default_factory=list)  # why a step failed (a refused launch says which field)
    figures: dict[str, str] = field(default_factory=dict)  # the op's output metadata, but its markdown
    rows: str | None = None  # the op's markdown table of rows (replay's "rows")
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class DagsterClient:
    """The Dagster UI at ``base_url`` (what the page links to: a browser's address for it), launched through at
    ``api_url`` (the page's own way to the webserver, e.g. a container's ``http://webserver:3000``; default the
    same address)."""

    def __init__(self, base_url: str, timeout_s: float = 10.0, *, api_url: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.api = (api_url or base_url).rstrip("/")
        self.links = DagsterLinks(self.base)
        self.timeout_s = timeout_s
        self._selectors: dict[str, dict[str, str]] = {}

    def unavailable(self, why: str) -> DagsterUnavailable:
        where = "OUTBOX_UI_URL" if self.api == self.base else "--dagster-url"
        return DagsterUnavailable(
            f"The Dagster UI at {self.api} does not answer ({why}): start it with 'outbox-pipelines dev' (or set "
            f"{where} to where it runs) and try again; nothing was launched."
        )

    def _graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        try:
            response = httpx.post(
                self.api + "/graphql", json={"query": query, "variables": variables}, timeout=self.timeout_s
            )
        except httpx.TimeoutException:
            raise self.unavailable(f"no answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise self.unavailable(type(exc).__name__) from None
        if response.status_code != 200:
            raise self.unavailable(f"HTTP {response.status_code} from /graphql")
        body = response.json()
        if body.get("errors"):
            raise LaunchRefused("; ".join(mask_credentials(str(e.get("message"))) for e in body["errors"]))
        data: dict[str, Any] = body["data"]
        return data

    def selector(self, job: str) -> dict[str, str]:
        """Where the job lives (its code location and repository), asked once."""
        if job not in self._selectors:
            found = self._graphql(_REPOSITORIES)["repositoriesOrError"]
            if found["__typename"] != "RepositoryConnection":
                raise LaunchRefused(f"Dagster cannot load the code location: {found.get('message', '')[:500]}")
            for repo in found["nodes"]:
                if job in {j["name"] for j in repo["jobs"]}:
                    self._selectors[job] = {
                        "repositoryLocationName": repo["location"]["name"],
                        "repositoryName": repo["name"],
                        "jobName": job,
                    }
                    break
            else:
                raise LaunchRefused(f"no code location served by {self.api} has the job {job}")
        return self._selectors[job]

    def launch(self, action: str, config: dict[str, Any], tags: dict[str, str]) -> str:
        """Launch the action's job with ``config`` for its op; the run's id. LaunchRefused with Dagster's words."""
        job, op = JOBS[action]
        params = {
            "selector": self.selector(job),
            "runConfigData": {"ops": {op: {"config": config}}},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        launched = self._graphql(_LAUNCH, params=params)["launchRun"]
        if launched["__typename"] == "LaunchRunSuccess":
            run_id: str = launched["run"]["runId"]
            return run_id
        if launched["__typename"] == "RunConfigValidationInvalid":
            raise LaunchRefused("; ".join(e["message"] for e in launched["errors"]))
        raise LaunchRefused(f"{launched['__typename']}: {mask_credentials(str(launched.get('message', '')))[:1000]}")

    def run(self, run_id: str) -> RunView:
        found = self._graphql(_RUN, id=run_id)["runOrError"]
        if found["__typename"] != "Run":
            raise LaunchRefused(found.get("message") or f"no run {run_id}")
        tags = {t["key"]: t["value"] for t in found["tags"]}
        dry = tags.get("outbox/dry_run")
        view = RunView(run_id, found["status"], dry_run=None if dry is None else dry == "true", tags=tags)
        for event in found["eventConnection"]["events"]:
            kind = event["__typename"]
            if kind == "LogMessageEvent" and event.get("stepKey") and event.get("level") != "DEBUG":
                view.logged.append(event["message"])
            elif kind == "ExecutionStepFailureEvent" and event.get("error"):
                view.failures.append(event["error"]["message"].strip())
            elif kind == "ExecutionStepOutputEvent":
                for entry in event.get("metadataEntries") or []:
                    if "mdStr" in entry:
                        view.rows = entry["mdStr"] if entry["label"] == "rows" else view.rows
                        continue
                    value = entry.get("text", entry.get("intRepr", entry.get("boolValue")))
                    if value is not None:
                        view.figures[entry["label"]] = str(value)
        view.logged = [mask_credentials(line) for line in view.logged]
        view.failures = [mask_credentials(line)[:2000] for line in view.failures]
        return view

    def run_url(self, run_id: str) -> str:
        return self.links.run(run_id)

    def table_url(self, table: str) -> str:
        return self.links.table(table)
