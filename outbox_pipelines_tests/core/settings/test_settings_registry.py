"""The settings registry (core/settings/registry/) says what the engine does: every key a section may carry and
every environment variable the engine reads is in it, with the default a user really gets; and what it renders
is what the reference shows."""

import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path
from typing import Any

import pytest

import outbox_pipelines
from outbox_pipelines.core import canonical
from outbox_pipelines.core.deadlines import DEFAULT_COMMAND_TIMEOUT_S, seconds_from_env
from outbox_pipelines.core.destinations.http.destination import TRANSPORTS
from outbox_pipelines.core.oncall import alerts
from outbox_pipelines.core.relay import stop
from outbox_pipelines.core.retry import PRESETS
from outbox_pipelines.core.settings import (
    DESTINATION_KINDS,
    INTERNAL_KEYS,
    TABLE_KEYS,
    GlobalSettings,
    TableSettings,
    load_settings,
)
from outbox_pipelines.core.settings.declarations import Declaration
from outbox_pipelines.core.settings.registry import (
    ENVIRONMENT,
    ENVIRONMENT_BY_NAME,
    GROUPS,
    KINDS,
    TABLE_KEY_REGISTRY,
    render_environment_markdown,
    render_markdown,
    render_table_keys_markdown,
)
from outbox_pipelines.core.storage import network_limits
from outbox_pipelines.core.storage.migration_safety import LockWaits
from outbox_pipelines.core.telemetry import creation, metrics, tracing

PACKAGE = Path(outbox_pipelines.__file__).parent
ENGINE = PACKAGE / "core"
SETTINGS = ENGINE / "settings"
# A minimal usable section for each destination, that a key's default is tried on.
BASE_SECTIONS: dict[str, dict[str, Any]] = {
    "paper": {"destination": "paper"},
    "http": {"destination": "http", "url": "http://127.0.0.1:9/hook"},
    "handlers": {"destination": "handlers", "handlers": "outbox_pipelines.examples.handlers:registry"},
    "nats": {"destination": "nats", "url": "nats://127.0.0.1:4222"},
    "rabbitmq": {"destination": "rabbitmq", "url": "amqp://127.0.0.1:5672/"},
    "kafka": {"destination": "kafka", "bootstrap_servers": "127.0.0.1:9092"},
}
_TEXT_TOKENS = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
_VARIABLE = re.compile(r"\b(?:OUTBOX|OTEL)_[A-Z0-9_]*[A-Z0-9]\b")


def _variables_named_in(root: Path) -> dict[str, Path]:
    """The environment variables named in the strings and comments of the Python file ``root``, or of those
    under it (a name in code, like the constant OUTBOX_COLUMNS, is not a variable), each with a file naming it."""
    named: dict[str, Path] = {}
    for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
        with path.open("rb") as source:
            for token in tokenize.tokenize(source.readline):
                if token.type in _TEXT_TOKENS:
                    for name in _VARIABLE.findall(token.string):
                        named.setdefault(name, path)
    return named


def _table(section: dict[str, Any], env: dict[str, str] | None = None) -> TableSettings:
    settings = load_settings(env=env or {}, declaration=Declaration({"registry_t": section}))
    assert not settings.broken, settings.broken
    return settings.tables["registry_t"]


def _written(default: str) -> Any:
    """A default as TOML reads it."""
    return tomllib.loads(f"value = {default}")["value"]


def _base(key_applies_to: tuple[str, ...]) -> dict[str, Any]:
    return dict(BASE_SECTIONS[key_applies_to[0] if key_applies_to else "paper"])


# ---- table keys ---------------------------------------------------------------------------------------------


def test_a_section_accepts_exactly_the_registrys_keys():
    assert TABLE_KEYS == {key.name for key in TABLE_KEY_REGISTRY}
    assert len(TABLE_KEY_REGISTRY) == len(TABLE_KEYS), "a key is in the registry twice"
    settings = load_settings(
        env={},
        declaration=Declaration({"registry_t": {"destination": "paper", "undocumented_key": 1}}),
    )
    assert "unknown keys ['undocumented_key']" in settings.broken["registry_t"]


def test_every_key_the_settings_read_from_a_section_is_in_the_registry():
    """A key read by name (section.get("key"), section["key"], "key" in section, a helper given (section, "key"))
    and not in the registry could never be written: the check refuses it."""
    pattern = re.compile(r'section(?:\.get\(|\[|, )"(\w+)"|"(\w+)" in section')
    read = {a or b for path in SETTINGS.glob("*.py") for a, b in pattern.findall(path.read_text())}
    assert {"destination", "url_env", "token_env", "topic_prefix", "batch_size"} <= read
    assert read - TABLE_KEYS - INTERNAL_KEYS == set()


def test_every_table_key_is_documented_in_the_registrys_terms():
    for key in TABLE_KEY_REGISTRY:
        assert key.kind in KINDS and key.group in GROUPS, key
        assert key.meaning and key.meaning == key.meaning.strip(), key
        assert bool(key.choices) == (key.kind == "choice"), key
        assert set(key.applies_to) <= set(DESTINATION_KINDS), key
        if key.default is not None:
            _written(key.default)  # a TOML value, as a user writes it
        if key.default_from is not None:
            assert key.default_from in ENVIRONMENT_BY_NAME, key


def test_the_registrys_choices_are_the_words_the_engine_accepts():
    by_name = {key.name: key for key in TABLE_KEY_REGISTRY}
    assert by_name["destination"].choices == DESTINATION_KINDS
    assert set(by_name["preset"].choices) == set(PRESETS)
    assert by_name["transport"].choices == TRANSPORTS
    for key in TABLE_KEY_REGISTRY:
        for word in key.choices:
            section = {**_base(key.applies_to), key.name: word}
            if key.name == "destination":
                section = _base((word,))
            _table(section)  # every documented word loads


@pytest.mark.parametrize("key", [key for key in TABLE_KEY_REGISTRY if key.default is not None], ids=lambda k: k.name)
def test_a_section_without_a_key_gets_the_registrys_default(key):
    base = _base(key.applies_to)
    assert _table({**base, key.name: _written(key.default)}) == _table(base)


DIFFERENT_VALUES = {
    "OUTBOX_PARALLELISM": "3",
    "OUTBOX_RELAY_MAX_ATTEMPTS": "7",
    "OUTBOX_BATCH_SIZE": "7",
    "OUTBOX_BATCH_BYTES": "65536",
    "OUTBOX_RELAY_LOCK_TTL": "30s",
    "OUTBOX_STUCK_THRESHOLD_MIN": "5",
    "OUTBOX_RELAY_ENABLED": "false",
    "OUTBOX_CLEANER_RETENTION": "1h",
    "OUTBOX_CLEANER_ENABLED": "false",
}


@pytest.mark.parametrize("key", [key for key in TABLE_KEY_REGISTRY if key.default_from], ids=lambda k: k.name)
def test_a_key_whose_default_a_variable_sets_follows_it(key):
    base = _base(key.applies_to)
    assert key.default_from in DIFFERENT_VALUES, f"give {key.default_from} a value other than its default here"
    env = {key.default_from: DIFFERENT_VALUES[key.default_from]}
    assert _table(base, env) != _table(base)


# ---- environment variables ----------------------------------------------------------------------------------


def test_every_variable_the_engine_names_is_in_the_registry():
    named = _variables_named_in(ENGINE)
    assert {"OUTBOX_DATABASE_URL", "OUTBOX_BATCH_SIZE", "OUTBOX_ALERT_WEBHOOK_URL", "OTEL_SERVICE_NAME"} <= set(named)
    missing = {name: str(path.relative_to(PACKAGE)) for name, path in named.items() if name not in ENVIRONMENT_BY_NAME}
    assert not missing, f"add these to core/settings/registry/variables.py: {missing}"


def test_every_registered_variable_is_named_where_it_says_it_is_read():
    for variable in ENVIRONMENT:
        where = PACKAGE / variable.read_by
        assert where.exists(), variable
        assert variable.name in _variables_named_in(where), variable
    assert len(ENVIRONMENT) == len(ENVIRONMENT_BY_NAME), "a variable is in the registry twice"


def test_the_engines_registry_lists_none_of_the_order_wings_own_variables():
    """The Order API's variables are the wing's (outbox_pipelines/orders); the engine's registry leaves them out."""
    wings_own = set(_variables_named_in(PACKAGE / "orders")) - set(_variables_named_in(ENGINE))
    assert "OUTBOX_API_TOKEN" in wings_own
    assert not wings_own & set(ENVIRONMENT_BY_NAME)
    assert not [name for name in ENVIRONMENT_BY_NAME if name.startswith("OUTBOX_API_")]


def _global_settings(variable: str, value: str | None) -> Any:
    return GlobalSettings.from_env({} if value is None else {variable: value})


def _alert_repeat(variable: str, value: str | None, monkeypatch: pytest.MonkeyPatch) -> float:
    _set(monkeypatch, variable, value)
    return alerts.repeat_every_s()


def _tenant_label(variable: str, value: str | None, monkeypatch: pytest.MonkeyPatch) -> str:
    _set(monkeypatch, variable, value)
    return metrics.tenant_label("registry_t", "tenant-a")


def _exports_spans(variable: str, value: str | None) -> bool:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **({} if value is None else {variable: value})}
    provider = tracing.configure_from_env("registry-test", env, install=False)
    if provider is not None:
        provider.shutdown()
    return provider is not None


def _set(monkeypatch: pytest.MonkeyPatch, variable: str, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)


@pytest.mark.parametrize("variable", [v for v in ENVIRONMENT if v.default is not None], ids=lambda v: v.name)
def test_a_variable_left_unset_gets_the_registrys_default(variable, monkeypatch):
    name, default = variable.name, variable.default
    if variable.read_by == "core/settings/environment.py":
        assert _global_settings(name, default) == _global_settings(name, None)
    elif name == "OUTBOX_MAX_PAYLOAD_BYTES":
        assert int(default) == canonical.DEFAULT_MAX_PAYLOAD_BYTES
    elif name == "OUTBOX_ALERT_REPEAT":
        assert _alert_repeat(name, default, monkeypatch) == _alert_repeat(name, None, monkeypatch)
    elif name == "OUTBOX_TRACE_CREATE":
        assert creation.create_spans_enabled({name: default}) == creation.create_spans_enabled({})
    elif name == "OUTBOX_TENANT_LABEL":
        assert _tenant_label(name, default, monkeypatch) == _tenant_label(name, None, monkeypatch)
    elif name.startswith("OTEL_"):
        assert _exports_spans(name, default) == _exports_spans(name, None)
    elif variable.read_by == "core/storage/network_limits.py":
        assert network_limits.limits({name: default}) == network_limits.limits({})
    elif name == "OUTBOX_RELAY_STOP_TIMEOUT_S":
        assert stop.stop_timeout_s({name: default}) == stop.stop_timeout_s({})
    elif name == "OUTBOX_COMMAND_TIMEOUT_S":
        assert seconds_from_env(name, DEFAULT_COMMAND_TIMEOUT_S, {name: default}) == DEFAULT_COMMAND_TIMEOUT_S
    elif name == "OUTBOX_MIGRATION_LOCK_TIMEOUT_MS":
        monkeypatch.delenv(name, raising=False)
        unset = LockWaits.from_env()
        monkeypatch.setenv(name, default)
        assert LockWaits.from_env() == unset
    else:
        pytest.fail(f"say here how to check {name}'s default")


# ---- the reference's tables ---------------------------------------------------------------------------------


def test_the_reference_tables_have_a_row_per_key_and_per_variable():
    keys = render_table_keys_markdown().splitlines()
    assert len(keys) == 2 + len(TABLE_KEY_REGISTRY)
    assert all(line.startswith("| `") and line.endswith(" |") for line in keys[2:])
    assert '| `timeout` | duration | `"5s"` |' in render_table_keys_markdown()
    variables = render_environment_markdown().splitlines()
    assert len(variables) == 2 + len(ENVIRONMENT)
    assert "| `OUTBOX_BATCH_SIZE` | `100` (`OUTBOX_RELAY_BATCH_SIZE` when unset) |" in render_environment_markdown()
    for table in (keys, variables):
        cells = len(re.split(r"(?<!\\)\|", table[0]))
        assert all(len(re.split(r"(?<!\\)\|", line)) == cells for line in table), table


def test_the_module_prints_the_reference_tables():
    module = "outbox_pipelines.core.settings.registry"
    result = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == render_markdown()
    only_keys = subprocess.run([sys.executable, "-m", module, "keys"], capture_output=True, text=True, timeout=60)
    assert only_keys.stdout == render_table_keys_markdown()
