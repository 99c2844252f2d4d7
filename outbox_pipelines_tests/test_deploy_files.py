"""deploy/ and docs/deploy.md checked without a network: the files parse, the compose services and
their variables match what the code reads, the Helm values use only keys Dagster's chart defines
(deploy/helm/chart-keys.txt), the image's command serves an importable code location, and the
workspace and instance files are what Dagster accepts."""

import ast
import functools
import importlib
import json
import re
import shlex
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.workspace.config_schema import process_workspace_config

from outbox_pipelines.cli import build_parser
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.defs.relay_group import GROUP_TAG, KIND_TAG, RELAY_KIND
from outbox_pipelines.defs.resources import TABLE_TAG
from outbox_pipelines_tests.test_docs import PACKAGE_PATH, PATH_REFERENCE

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yaml"
HELM_VALUES = DEPLOY / "helm" / "values.yaml"
HELM_ONCALL_PAGE = DEPLOY / "helm" / "oncall-page.yaml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

ALWAYS_ON = {"postgres", "migrate", "code-server", "webserver", "daemon", "oncall-page", "order-api"}
RELAY_PROFILE = "relays"
# What the official postgres image reads; every other service gets only variables the package reads.
POSTGRES_IMAGE_VARIABLES = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}
# The processes that open the Dagster instance (deploy/dagster.yaml); runs are children of the code server.
INSTANCE_READERS = {"code-server", "webserver", "daemon"}
OUTBOX_VARIABLE = re.compile(r"\bOUTBOX_[A-Z0-9_]*[A-Z0-9]\b")
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|KEY", re.IGNORECASE)


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = _load(COMPOSE)
    return loaded


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _environment(service: dict[str, Any]) -> dict[str, Any]:
    """A service's variables (mapping or KEY=VALUE list); a variable without a value passes through."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def _argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def _shell_commands(argv: list[str]) -> list[list[str]]:
    """The commands a service runs: its argv, or each `&&` step of an `sh -c` script."""
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(step.replace("exec ", "", 1)) for step in argv[2].split("&&")]
    return [argv]


@functools.cache
def _variables_the_package_reads() -> frozenset[str]:
    """Every OUTBOX_* name the package spells as a whole string literal (docstrings mention, code reads)."""
    names = set()
    for source in (ROOT / "outbox_pipelines").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and OUTBOX_VARIABLE.fullmatch(node.value):
                names.add(node.value)
    return frozenset(names)


def _dockerfile_cmd() -> list[str]:
    lines = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    assert len(lines) == 1, "deploy/Dockerfile has one CMD, in exec (JSON) form"
    cmd: list[str] = json.loads(lines[0][len("CMD ") :])
    return cmd


def _option(argv: list[str], *names: str) -> str:
    for name in names:
        if name in argv:
            return argv[argv.index(name) + 1]
    raise AssertionError(f"{argv} has none of {names}")


# -- every file parses ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_deploy_yaml_files_parse(path):
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents and all(isinstance(document, dict) for document in documents)


# -- docker compose -------------------------------------------------------------------------------
def test_compose_runs_the_always_on_services_and_relays_only_on_request():
    services = _services()
    always = {name for name, service in services.items() if not service.get("profiles")}
    on_request = {name: service["profiles"] for name, service in services.items() if service.get("profiles")}
    assert always == ALWAYS_ON
    assert on_request, "the standalone relays are in the compose file"
    assert all(profiles == [RELAY_PROFILE] for profiles in on_request.values()), on_request
    tables = load_settings().tables
    for name in on_request:
        argv = _argv(services[name])
        assert argv[:3] == ["outbox-pipelines", "relay", "--table"], f"{name} runs a standalone relay"
        assert argv[3] in tables, f"{name} relays a configured table"


def test_compose_runs_the_dagster_processes_on_the_deployed_workspace():
    services = _services()
    webserver, daemon = _argv(services["webserver"]), _argv(services["daemon"])
    assert webserver[0] == "dagster-webserver" and daemon[:2] == ["dagster-daemon", "run"]
    image_workspace = "/opt/dagster/workspace.yaml"
    assert _option(webserver, "-w", "--workspace") == image_workspace
    assert _option(daemon, "-w", "--workspace") == image_workspace
    assert f"COPY deploy/workspace.yaml {image_workspace}" in (DEPLOY / "Dockerfile").read_text()
    code_server = _shell_commands(_argv(services["code-server"]))[-1]
    assert code_server == _dockerfile_cmd(), "the compose code server runs the image's command after migrating"


def test_compose_order_api_listens_on_all_addresses_with_a_token():
    service = _services()["order-api"]
    argv = _argv(service)
    assert argv[:2] == ["outbox-pipelines", "order-api"] and _option(argv, "--host") == "0.0.0.0"
    assert "OUTBOX_API_TOKEN" in _environment(service)


def _published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each `ADDRESS:HOST:CONTAINER` a service publishes."""
    found = []
    for mapping in service.get("ports") or []:
        address, host_port, container_port = str(mapping).rsplit(":", 2)
        found.append((address, int(host_port), int(container_port)))
    return found


def _default(value: str) -> str:
    """The default of a compose value `${NAME:-default}`."""
    match = re.fullmatch(r"\$\{[A-Z_]+:-(.+)\}", value)
    assert match, f"{value!r} is not ${{NAME:-default}}"
    return match.group(1)


def test_compose_serves_the_oncall_page_like_the_ui_and_points_the_links_at_it():
    """The on-call page has no login and launches runs: published on loopback only, as the webserver is; it
    launches through the webserver's service and links where the browser reaches the UI; the code server (which
    evaluates the sensors) links tables and alerts to where the browser reaches the page."""
    services = _services()
    page, webserver, code_server = services["oncall-page"], services["webserver"], services["code-server"]
    argv = _argv(page)
    assert argv[:2] == ["outbox-pipelines", "oncall-page"] and "--allow-remote" in argv
    assert _option(argv, "--host") == "0.0.0.0"
    [(address, host_port, container_port)] = _published(page)
    [(ui_address, ui_port, _)] = _published(webserver)
    assert address == ui_address == "127.0.0.1" and container_port == int(_option(argv, "--port"))
    launches = urllib.parse.urlsplit(_option(argv, "--dagster-url"))
    assert launches.hostname == "webserver" and launches.port == int(_option(_argv(webserver), "-p"))
    page_env, code_env = _environment(page), _environment(code_server)
    assert "OUTBOX_DATABASE_URL" in page_env and "OUTBOX_CONFIG" in page_env
    assert page_env["OUTBOX_UI_URL"] == code_env["OUTBOX_UI_URL"]
    assert urllib.parse.urlsplit(_default(page_env["OUTBOX_UI_URL"])).port == ui_port
    assert urllib.parse.urlsplit(_default(code_env["OUTBOX_ONCALL_URL"])).port == host_port
    assert {"OUTBOX_BROKER_TOKEN", "OUTBOX_DAGSTER_PG_URL"}.isdisjoint(page_env), "only what the page reads"


def test_every_outbox_pipelines_command_in_compose_parses():
    parser = build_parser()
    for name, service in _services().items():
        if "command" not in service:
            continue
        for argv in _shell_commands(_argv(service)):
            if argv[0] == "outbox-pipelines":
                parser.parse_args(argv[1:])  # SystemExit on an unknown command or option
            else:
                assert argv[0] in ("dagster", "dagster-webserver", "dagster-daemon"), (name, argv)


def test_compose_sets_only_variables_their_readers_read():
    read = _variables_the_package_reads()
    for name, service in _services().items():
        variables = set(_environment(service))
        if name == "postgres":
            assert variables <= POSTGRES_IMAGE_VARIABLES, variables - POSTGRES_IMAGE_VARIABLES
        else:
            assert variables <= read, f"{name} sets variables nothing reads: {sorted(variables - read)}"


def test_every_process_that_opens_the_instance_gets_its_storage_url():
    wanted = set(_env_references(_load(DEPLOY / "dagster.yaml")))
    assert wanted == {"OUTBOX_DAGSTER_PG_URL"}
    services = _services()
    for name in INSTANCE_READERS:
        assert wanted <= set(_environment(services[name])), f"{name} reads the instance"


def _env_references(config: Any) -> Iterator[str]:
    """The variables a Dagster config file reads (`{env: NAME}`)."""
    if isinstance(config, dict):
        if set(config) == {"env"}:
            yield config["env"]
        for value in config.values():
            yield from _env_references(value)
    elif isinstance(config, list):
        for value in config:
            yield from _env_references(value)


@pytest.mark.parametrize(
    "path",
    [
        "deploy/docker-compose.yaml",
        "deploy/helm/values.yaml",
        "deploy/helm/migrate-job.yaml",
        "deploy/helm/oncall-page.yaml",
        "deploy/dagster.yaml",
        "docs/deploy.md",
    ],
)
def test_every_outbox_variable_named_is_one_the_package_reads(path):
    named = set(OUTBOX_VARIABLE.findall((ROOT / path).read_text()))
    unknown = named - _variables_the_package_reads()
    assert not unknown, f"{path} names variables outbox_pipelines never reads: {sorted(unknown)}"


# -- the image ------------------------------------------------------------------------------------
def test_dockerfile_serves_an_importable_code_location():
    cmd = _dockerfile_cmd()
    assert cmd[:3] == ["dagster", "code-server", "start"]
    assert _option(cmd, "-h", "--host") == "0.0.0.0" and _option(cmd, "-p", "--port") == "4000"
    module = importlib.import_module(_option(cmd, "-m", "--module-name"))
    assert isinstance(getattr(module, _option(cmd, "-a", "--attribute")), dg.Definitions)


def test_dockerfile_runs_as_an_unprivileged_user_with_no_secrets_baked_in():
    text = (DEPLOY / "Dockerfile").read_text()
    from_lines = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert from_lines and all(image == "python:3.11-slim" for image in from_lines)
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    baked = [line for line in text.splitlines() if line.startswith(("ENV ", "ARG ")) and SECRET_NAME.search(line)]
    assert not baked, baked
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"deploy/Dockerfile copies {source}, which is not in the repository"


# -- Dagster's files ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["workspace.yaml", "workspace.local.yaml"])
def test_workspace_is_a_dagster_workspace_on_the_code_server(name):
    config = _load(DEPLOY / name)
    result = process_workspace_config(config)
    assert result.success, result.errors
    [location] = config["load_from"]
    server = location["grpc_server"]
    assert server["port"] == int(_option(_dockerfile_cmd(), "-p"))
    # Named as the repository's workspace.yaml names its location, so run history reads alike.
    [development] = _load(ROOT / "workspace.yaml")["load_from"]
    assert server["location_name"] == development["python_module"]["module_name"]
    if name == "workspace.yaml":
        assert server["host"] in _services(), "the host is the compose service of the code server"


def test_instance_is_a_valid_dagster_instance_with_the_per_table_run_limit():
    config, custom_class = dagster_instance_config(str(DEPLOY))
    assert custom_class is None and "postgres" in config["storage"]
    coordinator = config["run_coordinator"]
    assert coordinator["class"] == "QueuedRunCoordinator"
    result = process_config(QueuedRunCoordinator.config_type(), coordinator["config"])
    assert result.success, result.errors
    assert _run_limits(coordinator["config"]["tag_concurrency_limits"]) == {
        (GROUP_TAG, "each"): 2,
        (TABLE_TAG, "each"): 2,
        (KIND_TAG, RELAY_KIND): 8,
    }
    assert coordinator["config"]["max_concurrent_runs"] > 8, "relay runs leave slots for maintenance"
    development = _load(ROOT / "dagster.yaml")["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert _run_limits(development) == _run_limits(coordinator["config"]["tag_concurrency_limits"])


def test_a_skipped_tick_is_kept_a_day_in_every_instance():
    """Maintenance schedules skip their tick when there is nothing to do: those ticks go after a day, in
    development, in deploy/dagster.yaml and in the Helm values alike."""
    development = _load(ROOT / "dagster.yaml")["retention"]["schedule"]["purge_after_days"]
    deployed = _load(DEPLOY / "dagster.yaml")["retention"]["schedule"]["purge_after_days"]
    helm = _load(HELM_VALUES)["retention"]["schedule"]["purgeAfterDays"]
    assert development["skipped"] == deployed["skipped"] == helm["skipped"] == 1
    assert {k: deployed[k] for k in ("failure", "success")} == {k: helm[k] for k in ("failure", "success")}


def _run_limits(limits: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """The run limits by (tag key, 'each' for a limit per unique value, or the tag's value)."""
    found = {}
    for limit in limits:
        value = limit.get("value")
        found[
            (limit["key"], "each" if isinstance(value, dict) and value.get("applyLimitPerUniqueValue") else value)
        ] = limit["limit"]
    return found


# -- Helm -----------------------------------------------------------------------------------------
@functools.cache
def _chart_keys() -> tuple[frozenset[str], tuple[str, ...]]:
    """The chart's key paths (deploy/helm/chart-keys.txt), and the prefixes under which anything goes."""
    lines = [line.strip() for line in (DEPLOY / "helm" / "chart-keys.txt").read_text().splitlines()]
    keys = [line for line in lines if line and not line.startswith("#")]
    free = tuple(key[: -len(".*")] for key in keys if key.endswith(".*"))
    return frozenset(key for key in keys if not key.endswith(".*")), free


def _key_paths(value: Any, prefix: str = "") -> Iterator[str]:
    """Every key path of a values file: `a.b`, and `a[].c` for the keys of a list's items."""
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _key_paths(child, path)
    elif isinstance(value, list):
        for item in value:
            yield from _key_paths(item, f"{prefix}[]")


def _defined_by_chart(path: str) -> bool:
    keys, free = _chart_keys()
    return path in keys or path in free or any(path.startswith((prefix + ".", prefix + "[]")) for prefix in free)


def test_helm_values_use_only_keys_the_chart_defines():
    undefined = [path for path in _key_paths(_load(HELM_VALUES)) if not _defined_by_chart(path)]
    assert not undefined, f"deploy/helm/values.yaml uses keys the chart does not define: {undefined}"


def test_the_key_check_refuses_a_key_the_chart_lacks():
    assert not _defined_by_chart("dagsterDaemon.runCoordinator.config.queuedRunCoordinator.maxRuns")
    assert not _defined_by_chart("userDeployments")
    assert _defined_by_chart("dagster-user-deployments.deployments[].env.OUTBOX_UI_URL")


def test_helm_values_deploy_the_code_location_with_k8s_runs_and_per_table_limits():
    values = _load(HELM_VALUES)
    [deployment] = values["dagster-user-deployments"]["deployments"]
    cmd = _dockerfile_cmd()
    assert deployment["port"] == int(_option(cmd, "-p"))
    grpc_args = deployment["dagsterApiGrpcArgs"]
    assert _option(grpc_args, "-m") == _option(cmd, "-m") and _option(grpc_args, "-a") == _option(cmd, "-a")
    assert deployment["envSecrets"], "the outbox's settings come from a secret"
    assert deployment["includeConfigInLaunchedRuns"]["enabled"], "run pods get the deployment's secrets"
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is False
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] and coordinator["type"] == "QueuedRunCoordinator"
    limits = coordinator["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]
    instance_limits = _load(DEPLOY / "dagster.yaml")["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert _run_limits(limits) == _run_limits(instance_limits), "the same run limits as deploy/dagster.yaml"


def test_migrate_job_runs_the_migrations_from_the_same_secret():
    job = _load(DEPLOY / "helm" / "migrate-job.yaml")
    [container] = job["spec"]["template"]["spec"]["containers"]
    build_parser().parse_args(container["command"][1:])
    assert container["command"][:3] == ["outbox-pipelines", "db", "upgrade"]
    [deployment] = _load(HELM_VALUES)["dagster-user-deployments"]["deployments"]
    assert [source["secretRef"]["name"] for source in container["envFrom"]] == [
        secret["name"] for secret in deployment["envSecrets"]
    ]
    assert container["image"] == f"{deployment['image']['repository']}:{deployment['image']['tag']}"


def test_helm_oncall_page_runs_from_the_same_image_and_secret_with_no_external_address():
    deployment, service = _load_all(HELM_ONCALL_PAGE)
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    argv = container["command"]
    build_parser().parse_args(argv[1:])
    assert argv[:2] == ["outbox-pipelines", "oncall-page"] and "--allow-remote" in argv
    assert _option(argv, "--host") == "0.0.0.0"
    values = _load(HELM_VALUES)
    [user] = values["dagster-user-deployments"]["deployments"]
    assert container["image"] == f"{user['image']['repository']}:{user['image']['tag']}"
    assert [s["secretRef"]["name"] for s in container["envFrom"]] == [s["name"] for s in user["envSecrets"]]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["OUTBOX_UI_URL"] == user["env"]["OUTBOX_UI_URL"], "its links go where the alerts' go"
    assert user["env"]["OUTBOX_ONCALL_URL"].startswith("https://"), "asset pages and alerts link to the page"
    assert service["spec"]["type"] == "ClusterIP" and "externalIPs" not in service["spec"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    [port] = service["spec"]["ports"]
    assert port["port"] == int(_option(argv, "--port"))


def _load_all(path: Path) -> list[Any]:
    return list(yaml.safe_load_all(path.read_text()))


# -- docs/deploy.md ---------------------------------------------------------------------------------
def test_deploy_doc_names_only_paths_that_exist():
    text = DEPLOY_DOC.read_text()
    missing = {
        path
        for path in PATH_REFERENCE.findall(text)
        if "*" not in path and "<" not in path and not (ROOT / path.rstrip("/.")).exists()
    }
    missing |= {path for path in PACKAGE_PATH.findall(text) if not (ROOT / "outbox_pipelines" / path).exists()}
    assert not missing, f"docs/deploy.md names paths that do not exist: {sorted(missing)}"


def test_deploy_doc_names_only_commands_that_exist():
    commands = _subcommands(build_parser())
    named = re.findall(r"outbox-pipelines ([a-z-]+)(?: ([a-z-]+))?", DEPLOY_DOC.read_text())
    assert named
    for command, sub in named:
        assert command in commands, f"docs/deploy.md names `outbox-pipelines {command}`"
        if commands[command]:
            assert sub in commands[command], f"docs/deploy.md names `outbox-pipelines {command} {sub}`"


def _subcommands(parser: Any) -> dict[str, set[str]]:
    """The CLI's commands, each with its own subcommands (empty when it has none)."""
    found: dict[str, set[str]] = {}
    for action in parser._subparsers._group_actions:  # argparse keeps the subparsers here
        for name, child in action.choices.items():
            found[name] = set(_subcommands(child)) if child._subparsers else set()
    return found
