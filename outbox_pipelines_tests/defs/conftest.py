import dagster as dg
import pytest

from outbox_pipelines.defs.resources import outbox_resources


@pytest.fixture
def instance():
    with dg.instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def resources(db_url):
    return outbox_resources(url=db_url)


def orders_sent_to(tmp_path, db_url: str, broker_url: str) -> dict:
    """Resources whose settings send outbox_orders to ``broker_url`` (a deployment's outbox.toml says so)."""
    config = tmp_path / "orders-at.toml"
    config.write_text(f'[tables.outbox_orders]\nurl = "{broker_url}"\n')
    return outbox_resources(url=db_url, config_path=str(config))


def run_job(job_name: str, resources: dict, instance, run_config: dict | None = None, **kwargs):
    from outbox_pipelines.definitions import build_definitions

    job = build_definitions(resources).resolve_job_def(job_name)
    return job.execute_in_process(run_config=run_config, instance=instance, raise_on_error=False, **kwargs)


def op_metadata(result, op_name: str) -> dict:
    for event in result.all_events:
        if event.event_type_value == "STEP_OUTPUT" and event.step_key == op_name:
            return {k: getattr(v, "value", v) for k, v in event.event_specific_data.metadata.items()}
    raise AssertionError(f"no output metadata for {op_name}")
