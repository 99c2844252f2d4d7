"""Where a broker table's messages go (``destination = "nats" | "rabbitmq" | "kafka"``), read at load.

A table naming a broker whose extra is not installed fails when the settings load, with the ``pip install`` line.
Credentials stay out of ``outbox.toml``: read from the variable ``url_env`` (or ``token_env``) names; the
destination is shown by its origin only.
"""

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit

from outbox_pipelines.core.errors import ConfigError, MissingSecret
from outbox_pipelines.core.redaction import mask_url, unencoded_userinfo, url_origin
from outbox_pipelines.core.settings.registry import choices, keys_in
from outbox_pipelines.core.settings.values import one_of


@dataclass(frozen=True)
class BrokerKind:
    """One broker destination: the client module it needs, its extra, and the URL schemes it takes."""

    module: str
    extra: str
    schemes: tuple[str, ...]
    example: str


BROKERS: dict[str, BrokerKind] = {
    "nats": BrokerKind("nats", "nats", ("nats", "tls"), "nats://127.0.0.1:4222"),
    "rabbitmq": BrokerKind("aiormq", "rabbitmq", ("amqp", "amqps"), "amqp://127.0.0.1:5672/"),
    # Kafka takes bootstrap servers ("host:port,host:port"), not a URL.
    "kafka": BrokerKind("confluent_kafka", "kafka", (), "127.0.0.1:9092"),
}
# What names an environment variable (url_env, token_env, ...: a table names a variable, never a secret).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SERVER = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")
# A topic prefix goes in front of every message's topic: the characters every broker takes in a name.
_PREFIX = re.compile(r"^[A-Za-z0-9._\-]{0,100}$")
_EXCHANGE = re.compile(r"^[A-Za-z0-9._:\-]{1,127}$")
SECURITY_PROTOCOLS = choices("security_protocol")
SASL_MECHANISMS = choices("sasl_mechanism")
KAFKA_SECURITY_KEYS = tuple(key.name for key in keys_in("kafka_security"))


@dataclass(frozen=True)
class BrokerSettings:
    """A broker table's connection, as the destination builds its client from it."""

    kind: str
    # The broker URL (nats://, amqp://) or Kafka's bootstrap servers; may carry credentials: never shown.
    url: str = field(repr=False)
    # How the destination is named in logs, status, checks and alerts: its origin, without credentials.
    shown: str = ""
    # Put in front of each message's topic: the NATS subject, the Kafka topic, the RabbitMQ routing key.
    topic_prefix: str = ""
    # RabbitMQ: the exchange messages are published to (declared durable, type topic); the table's name.
    exchange: str = ""
    # NATS: the token sent at connect (``token_env``); never shown.
    token: str | None = field(default=None, repr=False)
    # Kafka: librdkafka's security settings (security.protocol, sasl.mechanism, sasl.username, sasl.password
    # read from ``sasl_password_env``); never shown.
    client_config: Mapping[str, str] = field(default_factory=dict, repr=False)


def env_variable(section: Mapping[str, Any], key: str, environ: Mapping[str, str], where: str) -> str | None:
    """The value of the environment variable the section's ``key`` names (None when the key is absent);
    ConfigError when the name is not one or the variable is unset."""
    name = section.get(key)
    if name is None:
        return None
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise ConfigError(f"{where} {key} must name an environment variable (like BILLING_SECRET), got {name!r}")
    value = environ.get(name, "").strip()
    if not value:
        raise MissingSecret(
            f"{where} {key} = {name!r}, but {name} is not set: set it in the environment of every "
            f"process that relays the table, or remove {key}"
        )
    return value


def missing_extra(kind: str) -> str | None:
    """The sentence to act on when the broker's client library is not installed, else None."""
    broker = BROKERS[kind]
    if importlib.util.find_spec(broker.module) is not None:
        return None
    return (
        f'destination = "{kind}" needs the {broker.module} client library: run '
        f"pip install 'outbox_pipelines[{broker.extra}]' in the environment that runs the outbox "
        "(Dagster's code server and run workers too)"
    )


def _kafka_servers(value: str, where: str) -> tuple[str, str]:
    """Kafka's bootstrap servers, checked; the list and how it is shown. A list holding a credential pasted in
    (``user:password@host:9092``, ``SASL_SSL://user:password@host:9092``) is refused, shown masked."""
    if "@" in value:
        raise ConfigError(
            f"{where} bootstrap_servers = {mask_url(value)!r} holds a user-info (user:password@): Kafka takes its "
            "credentials from sasl_username and sasl_password_env (the password read from the environment), "
            "never from bootstrap_servers; write them as host:port[,host:port...]"
        )
    servers = [part.strip() for part in value.split(",") if part.strip()]
    if not servers or not all(_SERVER.fullmatch(s) for s in servers):
        raise ConfigError(f"{where} bootstrap_servers must be host:port[,host:port...], got {mask_url(value)!r}")
    return ",".join(servers), servers[0] + (f" (+{len(servers) - 1})" if len(servers) > 1 else "")


def split_url(url: str, what: str) -> SplitResult:
    """The URL's parts; ConfigError naming ``what`` (without the URL's credentials) when it is not a URL or its
    port is out of range."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port out of range)
    except ValueError:
        raise ConfigError(f"{what} = {mask_url(url)!r} is not a valid URL") from None
    return parts


def _broker_url(kind: str, url: str, where: str) -> tuple[str, str]:
    broker = BROKERS[kind]
    problem = unencoded_userinfo(url, f"{where} url")
    if problem is not None:
        raise ConfigError(problem)
    shown = mask_url(url)
    parts = split_url(url, f"{where} url")
    if parts.scheme not in broker.schemes or not parts.hostname:
        schemes = " or ".join(f"{s}://" for s in broker.schemes)
        raise ConfigError(
            f'{where} url = {shown!r}: destination = "{kind}" needs a {schemes} URL with a host (like {broker.example})'
        )
    return url, url_origin(url)


def _text(section: Mapping[str, Any], key: str, pattern: re.Pattern[str], default: str, where: str) -> str:
    value = section.get(key, default)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(f"{where} {key} must be letters, digits and . _ - only, got {value!r}")
    return value


def broker_settings(
    name: str, kind: str, section: Mapping[str, Any], url: str | None, environ: Mapping[str, str], where: str
) -> BrokerSettings:
    """A broker table's settings; ``url`` is the section's ``url`` or its ``url_env`` variable's value."""
    problem = missing_extra(kind)
    if problem:
        raise ConfigError(f"{where} {problem}")
    if kind == "kafka":
        servers = section.get("bootstrap_servers") or url
        if url and section.get("bootstrap_servers"):
            raise ConfigError(f"{where} names both bootstrap_servers and url: a Kafka table takes bootstrap_servers")
        if not isinstance(servers, str) or not servers.strip():
            raise ConfigError(
                f'{where} destination = "kafka" needs bootstrap_servers = "host:9092" '
                "(or url_env naming a variable that holds them)"
            )
        connect, shown = _kafka_servers(servers, where)
        shown = f"kafka://{shown}"
    else:
        if not url:
            raise ConfigError(
                f'{where} destination = "{kind}" has no url: set url = "{BROKERS[kind].example}", '
                "or url_env naming the variable that holds it (with its credentials)"
            )
        connect, shown = _broker_url(kind, url, where)
    if kind != "kafka" and any(key in section for key in KAFKA_SECURITY_KEYS):
        raise ConfigError(f'{where} {", ".join(KAFKA_SECURITY_KEYS)} apply to destination = "kafka" only')
    if kind != "nats" and "token_env" in section:
        raise ConfigError(
            f'{where} token_env applies to destination = "http" or "nats"; put a {kind} '
            "credential in the URL read from url_env"
        )
    if kind != "rabbitmq" and "exchange" in section:
        raise ConfigError(f'{where} exchange applies to destination = "rabbitmq" only')
    return BrokerSettings(
        kind=kind,
        url=connect,
        shown=shown,
        topic_prefix=_text(section, "topic_prefix", _PREFIX, "", where),
        exchange=_text(section, "exchange", _EXCHANGE, name, where) if kind == "rabbitmq" else "",
        token=env_variable(section, "token_env", environ, where) if kind == "nats" else None,
        client_config=_kafka_security(section, environ, where) if kind == "kafka" else {},
    )


def _kafka_security(section: Mapping[str, Any], environ: Mapping[str, str], where: str) -> dict[str, str]:
    """librdkafka's security settings from a Kafka table's keys; the password from the environment only."""
    config: dict[str, str] = {}
    if "security_protocol" in section:
        config["security.protocol"] = one_of(
            section["security_protocol"], SECURITY_PROTOCOLS, f"{where} security_protocol"
        )
    if "sasl_mechanism" in section:
        config["sasl.mechanism"] = one_of(section["sasl_mechanism"], SASL_MECHANISMS, f"{where} sasl_mechanism")
    user, password = section.get("sasl_username"), env_variable(section, "sasl_password_env", environ, where)
    if (user is None) != (password is None):
        raise ConfigError(
            f"{where} sasl_username and sasl_password_env go together: name both (the password "
            "is read from the variable, never written in the file)"
        )
    if user is not None and password is not None:
        if not isinstance(user, str) or not user:
            raise ConfigError(f"{where} sasl_username must be a user name, got {user!r}")
        config.update({"sasl.username": user, "sasl.password": password})
        config.setdefault("security.protocol", "SASL_SSL")
        config.setdefault("sasl.mechanism", "PLAIN")
    return config
