"""Where a table's messages go, read from its section at start-up: the destination kind, its URL and the
credential sent with it, and its handlers module; never found wrong at the first delivery.

A broker's keys are brokers.py's; this module decides which destination reads them.
"""

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import ConfigError, MissingSecret
from outbox_pipelines.core.redaction import mask_url, secrets_in, unencoded_userinfo
from outbox_pipelines.core.retry import RetryPolicy
from outbox_pipelines.core.settings.brokers import (
    BROKERS,
    ENV_NAME,
    BrokerSettings,
    broker_settings,
    env_variable,
    split_url,
)
from outbox_pipelines.core.settings.environment import BROKER_TOKEN_ENV, GlobalSettings, bearer_token
from outbox_pipelines.core.settings.handler_specs import spec_target_problem
from outbox_pipelines.core.settings.registry import keys_in
from outbox_pipelines.core.settings.signing_secret import signing_keys
from outbox_pipelines.core.settings.tables import destination_kinds, url_destinations
from outbox_pipelines.core.settings.values import one_of

# What a shipped table's ``url_from_env`` may name: the GlobalSettings field, and the variable it comes from.
URL_FROM_ENV = {"broker_url": "OUTBOX_BROKER_URL"}
# The keys only a broker destination reads (nats, rabbitmq, kafka).
_BROKER_KEYS = frozenset(key.name for group in ("broker", "kafka_security") for key in keys_in(group))


def import_attribute(spec: str, what: str, shape: str = "package.module:attribute") -> Any:
    """What 'package.module:attribute' names (None when the module has no such attribute).

    ConfigError when ``spec`` is not of that ``shape`` or the module cannot be imported; ``what``
    says where the spec came from ("handlers", a table's destination ...).
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{what} = {spec!r}: write it as '{shape}'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name
        if missing and not _is_on_the_way(missing, module_name):
            # The module was found; a module it needs (directly or not) is not installed here.
            raise ConfigError(
                f"{what} = {spec!r}: importing {module_name} needs {missing}, which is not installed here ({exc}): "
                f"install it in every process that runs the outbox (the CLI's, Dagster's code server's)"
            ) from None
        raise ModuleNotImportable(f"{what} = {spec!r}: cannot import {module_name}: {exc}") from None
    except ImportError as exc:  # found, but a name it imports is not there (a typo, a version, a cycle)
        raise ConfigError(f"{what} = {spec!r}: importing {module_name} raised ImportError: {exc}") from None
    return getattr(module, attribute, None)


class ModuleNotImportable(ConfigError):
    """The module a spec names (or a package on its way) cannot be found."""


def _is_on_the_way(missing: str, module_name: str) -> bool:
    """Whether ``missing`` is ``module_name`` or one of its packages (a.b for a.b.c)."""
    return module_name == missing or module_name.startswith(missing + ".")


def _same_origin(url: str, other: str | None) -> bool:
    if not other:
        return False
    try:
        a, b = urlsplit(url), urlsplit(other)
        return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)
    except ValueError:
        return False


def _table_token(section: Mapping[str, Any], url: str | None, env: GlobalSettings, where: str) -> str | None:
    """The bearer token a URL table sends: the variable its ``token_env`` names; else OUTBOX_BROKER_TOKEN when
    its URL is at the broker's origin (OUTBOX_BROKER_URL's, or the shipped orders table's own); else none. The
    broker's credential never goes to another origin unless a table names it: where it goes is the deployment's
    decision, written in the settings."""
    name = section.get("token_env")
    if name is not None:
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise ConfigError(
                f"{where} token_env must name an environment variable (like BILLING_HOOK_TOKEN), got {name!r}"
            )
        token = env.broker_token if name == BROKER_TOKEN_ENV else bearer_token(env.environ, name)
        if token is None:
            raise MissingSecret(f"{where} token_env = {name!r}, but {name} is not set: set it, or remove token_env")
        return token
    if url and (section.get("url_from_env") or _same_origin(url, env.broker_url)):
        return env.broker_token
    return None


def check_destination_credentials(what: str, url: str, env: GlobalSettings, token: str | None = None) -> None:
    """Refuse, at start-up, a destination URL that cannot be used or carries two credentials (shown without them).

    ``what`` names where the URL came from ("OUTBOX_BROKER_URL", "[tables.NAME] url").
    """
    refuse_two_way_url(url, what)
    shown = mask_url(url)
    parts = split_url(url, what)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} = {shown!r} must be an http:// or https:// URL with a host")
    if "@" in parts.netloc and token:
        raise ConfigError(
            f"{what} = {shown} carries user:password and a bearer token is set for it too (OUTBOX_BROKER_TOKEN, or "
            "the table's token_env): a request carries one credential. Keep the user-info (sent as Basic auth) and "
            "unset the token, or remove the user-info from the URL (the token is sent as a bearer)"
        )


def refuse_two_way_url(url: str, what: str) -> None:
    """ConfigError, "percent-encode the password", when a client would read the URL otherwise than it is shown: a
    raw '@', '#', '?' or '/' in its user-info makes httpx (or a broker client) send to a host taken out of the
    password, with the rest of it as the credential."""
    problem = unencoded_userinfo(url, what)
    if problem is not None:
        raise ConfigError(problem)


@dataclass(frozen=True)
class Where:
    """Where a table's messages go, as its section and the environment say."""

    destination: str
    url: str | None
    token: str | None
    delivers_nowhere: str | None
    broker: BrokerSettings | None = None
    signing_secret: str | None = None


def table_destination(
    name: str, section: Mapping[str, Any], env: GlobalSettings, policy: RetryPolicy, where: str
) -> Where:
    """The destination kind, URL and credential; checked here, at start-up, not at the first delivery.

    There is no implicit destination: a table names one; ``http`` needs its ``url``. The paper broker is an
    explicit choice (or the shipped orders table's while OUTBOX_BROKER_URL is unset, seed 001's default),
    and then ``delivers_nowhere`` says so wherever the table's destination is shown.
    """
    if "destination" not in section:
        raise ConfigError(
            f'{where} names no destination: set destination = "http" (with url = ...), '
            '"handlers" (with handlers = "package.module:registry"), a broker ("nats", '
            '"rabbitmq" with url = ..., "kafka" with bootstrap_servers = ...) or "paper" '
            "(messages are marked sent and go nowhere)"
        )
    destination = one_of(section["destination"], destination_kinds(), f"{where} destination")
    url, url_source = _table_url(section, env, where)
    if "signing_secret_env" in section and destination != "http":
        raise ConfigError(f'{where} signing_secret_env applies to destination = "http" (signed webhooks)')
    if destination in BROKERS:
        broker = broker_settings(name, destination, section, url, env.environ, where)
        return Where(destination, None, broker.token, None, broker=broker)
    broker_only = sorted(_BROKER_KEYS & set(section))
    if broker_only:
        raise ConfigError(
            f'{where} {", ".join(broker_only)} apply to a broker destination ("nats", "rabbitmq", "kafka")'
        )
    from_env = section.get("url_from_env")
    if url is None and from_env in URL_FROM_ENV:
        # A shipped table whose URL, unless its section sets one, comes from a variable
        # (the orders table: OUTBOX_BROKER_URL; unset, its paper broker, seed 001's default).
        url, url_source = getattr(env, from_env), URL_FROM_ENV[from_env]
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError(f"{where} url must be an http:// or https:// URL, got {url!r}")
    if destination == "http" and not url:
        raise ConfigError(
            f'{where} destination = "http" has no url: set url = "https://..." (the endpoint '
            "that receives the messages), or choose another destination. Nothing is delivered "
            "anywhere until it names one."
        )
    if destination == "handlers":
        _check_handlers(section.get("handlers"), where)
    token = None
    if destination in url_destinations() and url:
        token = _table_token(section, url, env, where)
        check_destination_credentials(url_source, url, env, token)
        policy.check_inside_window(table_name=name)
    elif "token_env" in section:
        raise ConfigError(f'{where} token_env applies to a table with a url (destination = "http")')
    secret = env_variable(section, "signing_secret_env", env.environ, where)
    if secret is not None:
        try:
            signing_keys(secret)
        except ValueError as exc:
            raise ConfigError(f"{where} signing_secret_env = {section['signing_secret_env']!r}: {exc}") from None
    return Where(destination, url, token, _nowhere(name, destination, url, from_env), signing_secret=secret)


def _table_url(section: Mapping[str, Any], env: GlobalSettings, where: str) -> tuple[Any, str]:
    """The section's ``url``, or the value of the variable its ``url_env`` names; and where it came from. A URL
    that reads two ways is refused here, whatever its destination, naming the setting or variable."""
    url = section.get("url")
    url_source = f"{where} url"
    if "url_env" in section:
        if url is not None:
            raise ConfigError(
                f"{where} names both url and url_env: keep one (url_env when the URL holds a "
                "credential, which then stays out of the file)"
            )
        url, url_source = (
            env_variable(section, "url_env", env.environ, where),
            f"{section['url_env']} ({where} url_env)",
        )
    if isinstance(url, str):
        refuse_two_way_url(url, url_source)
        if "url_env" not in section and secrets_in(url):
            # The declaration goes where the code goes (a repository, an image): a credential comes from the
            # deployment's environment (docs/explanation/security.md), as Kafka's sasl_password_env does.
            raise ConfigError(
                f"{where} url = {mask_url(url)} holds a credential, in a file that goes where the code goes: put "
                'the URL in a variable of the deployment\'s environment and name it instead (url_env = "NAME")'
            )
    return url, url_source


def _check_handlers(spec: Any, where: str) -> None:
    """The handlers module imports here, at load, as it must in every process that relays the table (the
    CLI, Dagster's code server and its run workers): a mistake fails this table when the settings load,
    never as a run that fails again at every launch."""
    if not spec:
        raise ConfigError(f"{where} destination = 'handlers' needs handlers = 'package.module:registry'")
    fix = (
        "make the module importable in every process that runs the outbox: put it in your project's "
        "package and install the project (pip install -e .), so Dagster's code server and run workers "
        "import it without PYTHONPATH; or fix the name"
    )
    try:
        registry = import_attribute(str(spec), f"{where} handlers", shape="package.module:registry")
    except ModuleNotImportable as exc:  # the module itself is not found: where it lives is the fix
        raise ConfigError(f"{exc}. To fix it, {fix}") from None
    except ConfigError:  # the spec's shape, or a module it imports that is not installed: said as it is
        raise
    except Exception as exc:  # the module's own code failed at import: say what it raised
        raise ConfigError(f"{where} handlers = {spec!r}: importing it raised {type(exc).__name__}: {exc}") from None
    if registry is None:
        module_name, _, attribute = str(spec).partition(":")
        raise ConfigError(
            f"{where} handlers = {spec!r}: {module_name} has no attribute {attribute!r}; "
            "name the HandlerRegistry it defines (package.module:registry)"
        )
    # What it names is checked, never called: "sys:exit" or "os:abort" is refused here, not run by a relay.
    problem = spec_target_problem(registry)
    if problem is not None:
        raise ConfigError(f"{where} handlers = {spec!r}: {problem}")


def _nowhere(name: str, destination: str, url: str | None, from_env: str | None) -> str | None:
    """The plain sentence for a table whose messages go nowhere (the paper broker), else None."""
    if destination == "paper":
        return (
            f'{name}: destination = "paper": every message is marked sent and delivered nowhere '
            '(set destination = "http" with a url, or "handlers", to deliver)'
        )
    if destination in wings.destinations() and not url:
        variable = URL_FROM_ENV.get(from_env or "", "its url")
        return (
            f"{name}: {variable} is unset: the paper broker marks every message sent and delivers nothing "
            f"(set {variable} to the broker's URL to deliver)"
        )
    return None
