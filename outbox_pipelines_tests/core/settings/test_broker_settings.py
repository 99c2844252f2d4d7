"""A broker table's settings, as an adopter writes them: what loads, what is refused at load and what it says."""

import importlib.util
from pathlib import Path

import pytest

from outbox_pipelines.core.settings import brokers as broker_settings
from outbox_pipelines.core.settings import load_settings

TABLE = "billing_outbox"


def load(tmp_path: Path, section: str, environ: dict[str, str] | None = None):
    path = tmp_path / "outbox.toml"
    path.write_text(f"shipped_tables = false\n[tables.{TABLE}]\n{section}\n")
    return load_settings(env=environ or {}, path=path)


def test_a_nats_table_reads_its_url_with_credentials_from_the_environment_and_shows_only_the_origin(tmp_path):
    settings = load(
        tmp_path,
        'destination = "nats"\nurl_env = "BILLING_NATS"\ntopic_prefix = "billing."',
        {"BILLING_NATS": "nats://relay:s3cret-pw@127.0.0.1:4222"},
    )
    broker = settings.table(TABLE).broker
    assert broker is not None
    assert (broker.kind, broker.shown, broker.topic_prefix) == ("nats", "nats://127.0.0.1:4222", "billing.")
    assert "s3cret-pw" not in repr(settings.table(TABLE))


def test_a_rabbitmq_exchange_defaults_to_the_table_name(tmp_path):
    broker = load(tmp_path, 'destination = "rabbitmq"\nurl = "amqp://127.0.0.1:5672/"').table(TABLE).broker
    assert broker is not None and broker.exchange == TABLE
    broker = (
        load(tmp_path, 'destination = "rabbitmq"\nurl = "amqp://127.0.0.1/"\nexchange = "crm.events"')
        .table(TABLE)
        .broker
    )
    assert broker is not None and broker.exchange == "crm.events"


def test_kafka_takes_bootstrap_servers(tmp_path):
    broker = (
        load(tmp_path, 'destination = "kafka"\nbootstrap_servers = "127.0.0.1:9092, 127.0.0.1:9093"')
        .table(TABLE)
        .broker
    )
    assert broker is not None
    assert (broker.url, broker.shown) == ("127.0.0.1:9092,127.0.0.1:9093", "kafka://127.0.0.1:9092 (+1)")


def test_kafka_sasl_reads_its_password_from_the_environment_only(tmp_path):
    settings = load(
        tmp_path,
        'destination = "kafka"\nbootstrap_servers = "127.0.0.1:9092"\n'
        'sasl_username = "relay"\nsasl_password_env = "KAFKA_PW"',
        {"KAFKA_PW": "pw-kafka-77"},
    )
    broker = settings.table(TABLE).broker
    assert broker is not None
    assert dict(broker.client_config) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "relay",
        "sasl.password": "pw-kafka-77",
    }
    assert "pw-kafka-77" not in repr(settings.table(TABLE))


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ('destination = "nats"', 'has no url: set url = "nats://127.0.0.1:4222"'),
        ('destination = "nats"\nurl = "http://127.0.0.1:4222"', "needs a nats:// or tls:// URL"),
        ('destination = "rabbitmq"\nurl = "nats://127.0.0.1"', "needs a amqp:// or amqps:// URL"),
        ('destination = "kafka"', 'needs bootstrap_servers = "host:9092"'),
        ('destination = "kafka"\nbootstrap_servers = "kafka://broker:9092"', "must be host:port"),
        ('destination = "nats"\nurl_env = "NOT_SET_ANYWHERE"', "NOT_SET_ANYWHERE is not set"),
        ('destination = "nats"\nurl = "nats://127.0.0.1"\nurl_env = "X"', "names both url and url_env"),
        ('destination = "nats"\nurl = "nats://127.0.0.1"\nexchange = "x"', "exchange applies to destination"),
        ('destination = "kafka"\nbootstrap_servers = "h:1"\ntoken_env = "T"', "token_env applies to"),
        ('destination = "nats"\nurl = "nats://127.0.0.1"\ntopic_prefix = "a b"', "topic_prefix must be letters"),
        ('destination = "http"\nurl = "http://127.0.0.1/"\ntopic_prefix = "a."', "topic_prefix apply to a broker"),
        ('destination = "kafka"\nbootstrap_servers = "h:1"\nsasl_username = "relay"', "go together"),
        ('destination = "kafka"\nbootstrap_servers = "h:1"\nsecurity_protocol = "TLS"', "security_protocol must be"),
        ('destination = "nats"\nurl = "nats://h"\nsasl_username = "u"', 'apply to destination = "kafka" only'),
        ('destination = "natss"\nurl = "nats://127.0.0.1"', "destination must be one of"),
    ],
)
def test_a_mistake_fails_the_table_at_load_saying_what_to_write(tmp_path, section, says):
    settings = load(tmp_path, section)
    assert TABLE in settings.broken, settings.tables
    assert says in settings.broken[TABLE]


@pytest.mark.parametrize(
    ("kind", "section"),
    [
        ("nats", 'url = "nats://127.0.0.1:4222"'),
        ("rabbitmq", 'url = "amqp://127.0.0.1/"'),
        ("kafka", 'bootstrap_servers = "127.0.0.1:9092"'),
    ],
)
def test_a_broker_whose_extra_is_missing_fails_at_load_with_the_pip_line(tmp_path, monkeypatch, kind, section):
    """Without the client library, the table is refused when the settings load (dg check defs, the code
    location, every command), never at its first delivery."""
    module = broker_settings.BROKERS[kind].module
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    settings = load(tmp_path, f'destination = "{kind}"\n{section}')
    assert f"pip install 'outbox_pipelines[{kind}]'" in settings.broken[TABLE]


def test_every_broker_builds_from_its_settings_and_is_named_by_its_origin(tmp_path):
    """The wiring finds each broker's module, and its destination is named without credentials."""
    from outbox_pipelines.core.destinations.wiring import build_destination

    environ = {"NATS_URL": "nats://u:pw-one@127.0.0.1:1", "AMQP_URL": "amqp://u:pw-two@127.0.0.1:1/"}
    for kind, section, shown in [
        ("nats", 'url_env = "NATS_URL"', "nats://127.0.0.1:1"),
        ("rabbitmq", 'url_env = "AMQP_URL"', "amqp://127.0.0.1:1"),
        ("kafka", 'bootstrap_servers = "127.0.0.1:1"', "kafka://127.0.0.1:1"),
    ]:
        settings = load(tmp_path, f'destination = "{kind}"\n{section}\ntimeout = "1s"', environ)
        destination = build_destination(settings.table(TABLE), settings)
        try:
            assert destination.name == shown
        finally:
            destination.close()


@pytest.mark.parametrize(
    "kind, url",
    [
        ("http", "https://hook:PwInFile1@hooks.example.com/in"),
        ("http", "https://hooks.example.com/in?token=TokInFile2"),
        ("nats", "nats://relay:PwInFile3@127.0.0.1:4222"),
        ("rabbitmq", "amqp://outbox:PwInFile4@127.0.0.1:5672/"),
    ],
)
def test_a_credential_written_in_the_declaration_is_refused_masked_and_url_env_named(tmp_path, kind, url):
    """outbox.toml goes where the code goes: a password or token in a table's url is refused at load (as Kafka's
    pasted user:password@ is), shown masked, with url_env as the fix; from the environment it is taken."""
    settings = load(tmp_path, f'destination = "{kind}"\nurl = "{url}"')
    told = settings.broken[TABLE]
    assert "holds a credential" in told and 'url_env = "NAME"' in told
    assert "InFile" not in told, told
    taken = load(tmp_path, f'destination = "{kind}"\nurl_env = "T_URL"', {"T_URL": url})
    assert TABLE in taken.tables, taken.broken
