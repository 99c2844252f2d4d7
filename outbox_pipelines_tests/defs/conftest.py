import dagster as dg
import pytest

from outbox_pipelines.defs.resources import outbox_resources
from outbox_pipelines_tests.scratch import DEMO_PARTS


@pytest.fixture
def instance():
    """Dagster's in-memory instance: a job run in process, its run, tags and logs read back, in a tenth of a second
    and no process (one on disk takes one to two seconds, and starts two processes a step to capture its logs)."""
    with dg.DagsterInstance.ephemeral() as test_instance:
        yield test_instance


@pytest.fixture
def persistent_instance():
    """An instance on disk, for what must refer to it (a sensor's evaluation)."""
    with dg.instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def resources(db_url):
    return outbox_resources(url=db_url)


def orders_sent_to(tmp_path, db_url: str, broker_url: str, url_env: str | None = None) -> dict:
    """Resources whose settings send outbox_orders to ``broker_url`` (a deployment's outbox.toml says so); with
    ``url_env``, the variable (set by the test) holding a URL with a credential, as a deployment's does."""
    config = tmp_path / "orders-at.toml"
    where = f'url_env = "{url_env}"' if url_env else f'url = "{broker_url}"'
    config.write_text(DEMO_PARTS + f"[tables.outbox_orders]\n{where}\n")
    return outbox_resources(url=db_url, config_path=str(config))


def run_job(job_name: str, resources: dict, instance, run_config: dict | None = None, **kwargs):
    from outbox_pipelines.definitions import build_definitions

    job = build_definitions(resources).resolve_job_def(job_name)
    return job.execute_in_process(run_config=run_config, instance=instance, raise_on_error=False, **kwargs)


def run_relay_job_declaring(tables: list[str], resources: dict, instance, run_config: dict):
    """``relay_job`` as a code location declaring ``tables`` builds it (its Enum of tables), run on ``resources``
    whose settings may say otherwise: a table removed from outbox.toml since the code location loaded."""
    from outbox_pipelines.defs.relay_group import relay_jobs

    [job] = [job for job in relay_jobs({}, tables) if job.name == "relay_job"]
    return job.execute_in_process(run_config=run_config, instance=instance, resources=resources, raise_on_error=False)


def op_metadata(result, op_name: str) -> dict:
    for event in result.all_events:
        if event.event_type_value == "STEP_OUTPUT" and event.step_key == op_name:
            return {k: getattr(v, "value", v) for k, v in event.event_specific_data.metadata.items()}
    raise AssertionError(f"no output metadata for {op_name}")


def evaluate_run_failure_alert(instance, resources: dict, result, times: int = 2) -> None:
    """outbox_run_failure_alert on the failed run ``result``, evaluated ``times`` times (two sensors, a retried
    tick): what it posts is the test's to read."""
    from outbox_pipelines.defs.alerts import run_failure_alert

    for _ in range(times):
        with dg.build_run_status_sensor_context(
            sensor_name="outbox_run_failure_alert",
            dagster_instance=instance,
            dagster_run=instance.get_run_by_id(result.run_id),
            dagster_event=result.get_run_failure_event(),
            resources={"outbox_db": resources["outbox_db"]},
        ) as context:
            run_failure_alert(context.for_run_failure())
