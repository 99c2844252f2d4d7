"""Settings: the environment and a project's tables, read once and checked at start-up.

Every name below is importable from ``outbox_pipelines.core.settings``; every key and variable is in
``registry/``. The modules: docs/explanation/codebase.md, "The settings room".
"""

from outbox_pipelines.core.settings.brokers import (
    BROKERS,
    KAFKA_SECURITY_KEYS,
    BrokerSettings,
    broker_settings,
    env_variable,
    split_url,
)
from outbox_pipelines.core.settings.declarations import Declaration, find_declaration, load_config_file
from outbox_pipelines.core.settings.destination import (
    URL_FROM_ENV,
    check_destination_credentials,
    import_attribute,
)
from outbox_pipelines.core.settings.environment import BROKER_TOKEN_ENV, GlobalSettings, env_bool, env_int
from outbox_pipelines.core.settings.loading import Settings, load_settings, load_settings_or_problem
from outbox_pipelines.core.settings.registry import TABLE_KEYS
from outbox_pipelines.core.settings.sections import INTERNAL_KEYS, build_table_settings
from outbox_pipelines.core.settings.tables import (
    AUDIT_MODES,
    CLAIM_MODES,
    DEFAULT_GROUP,
    DESTINATION_KINDS,
    MODES,
    ORDERING_POLICIES,
    SUCCESS_POLICIES,
    THRESHOLD_KEYS,
    URL_DESTINATIONS,
    CheckThresholds,
    TableSettings,
    destination_kinds,
    shipped_tables,
    url_destinations,
)
from outbox_pipelines.core.settings.values import parse_duration

__all__ = [
    "AUDIT_MODES",
    "BROKERS",
    "BROKER_TOKEN_ENV",
    "CLAIM_MODES",
    "DEFAULT_GROUP",
    "DESTINATION_KINDS",
    "INTERNAL_KEYS",
    "KAFKA_SECURITY_KEYS",
    "MODES",
    "ORDERING_POLICIES",
    "SUCCESS_POLICIES",
    "TABLE_KEYS",
    "THRESHOLD_KEYS",
    "URL_DESTINATIONS",
    "URL_FROM_ENV",
    "BrokerSettings",
    "CheckThresholds",
    "Declaration",
    "GlobalSettings",
    "Settings",
    "TableSettings",
    "broker_settings",
    "build_table_settings",
    "check_destination_credentials",
    "destination_kinds",
    "env_bool",
    "env_int",
    "env_variable",
    "find_declaration",
    "import_attribute",
    "load_config_file",
    "load_settings",
    "load_settings_or_problem",
    "parse_duration",
    "shipped_tables",
    "split_url",
    "url_destinations",
]
